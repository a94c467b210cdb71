#include "afterburner/serve/loadgen.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <random>

#include "afterburner/core/error.h"

namespace afterburner::serve {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// Answers still owed this long after the last send count as connection errors.
constexpr std::chrono::seconds kDrainTimeout{10};
constexpr std::chrono::milliseconds kReconnectPause{10};

std::string url_of(const Endpoint& server) { return "http://" + server.host + ":" + std::to_string(server.port); }

tcp::endpoint endpoint_of(const Endpoint& server) {
  return {net::ip::make_address(server.host), static_cast<unsigned short>(server.port)};
}

std::string request_text(const LoadOptions& options) {
  std::string head = (options.body().empty() ? "GET " : "POST ") + options.target() +
                     " HTTP/1.1\r\nHost: " + options.server().host + ":" + std::to_string(options.server().port) + "\r\n";
  if (options.body().empty()) return head + "\r\n";
  return head + "Content-Type: application/json\r\nContent-Length: " + std::to_string(options.body().size()) +
         "\r\n\r\n" + options.body();
}

double milliseconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// One run: every connection on the calling thread's io_context, one request outstanding each.
class LoadRun {
 public:
  explicit LoadRun(const LoadOptions& options)
      : options_(options), request_(request_text(options)), arrival_timer_(io_) {
    if (options.concurrency() < 1) throw UsageError("--concurrency", "must be at least 1");
    if (options.duration_seconds() <= 0) throw UsageError("--duration", "must be positive");
    if (options.rate() < 0) throw UsageError("--rate", "must not be negative");
    if (open_loop()) arrivals_ = poisson_arrivals(options.rate(), options.duration_seconds(), options.seed());
    for (int i = 0; i < options.concurrency(); ++i) connections_.push_back(std::make_unique<Connection>(io_));
  }

  LoadResult run() {
    start_ = last_answer_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options_.duration_seconds()));
    for (auto& connection : connections_) next_request(*connection);
    if (open_loop()) schedule_arrivals();
    io_.run_until(deadline_ + kDrainTimeout);
    connection_errors_ += outstanding_;  // never answered
    return result();
  }

 private:
  struct Connection {
    explicit Connection(net::io_context& io) : socket(io), retry(io) {}
    tcp::socket socket;
    net::steady_timer retry;
    beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> parser;
    Clock::time_point started;  // when the request was due: the send time, or its arrival in open loop
  };

  bool open_loop() const { return options_.rate() > 0; }

  void next_request(Connection& connection) {
    if (!open_loop()) {
      Clock::time_point now = Clock::now();
      if (now < deadline_) send(connection, now);
      return;
    }
    if (due_.empty()) return idle_.push_back(&connection);
    Clock::time_point due = due_.front();
    due_.pop_front();
    send(connection, due);
  }

  void schedule_arrivals() {
    Clock::time_point now = Clock::now();
    while (next_arrival_ < arrivals_.size() && arrival_time(next_arrival_) <= now) {
      due_.push_back(arrival_time(next_arrival_++));
    }
    while (!idle_.empty() && !due_.empty()) {
      Connection* connection = idle_.back();
      idle_.pop_back();
      next_request(*connection);
    }
    if (next_arrival_ == arrivals_.size()) return;
    arrival_timer_.expires_at(arrival_time(next_arrival_));
    arrival_timer_.async_wait([this](beast::error_code error) {
      if (!error) schedule_arrivals();
    });
  }

  Clock::time_point arrival_time(std::size_t index) const {
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals_[index]));
  }

  void send(Connection& connection, Clock::time_point started) {
    connection.started = started;
    ++outstanding_;
    if (connection.socket.is_open()) return write(connection);
    connection.socket.async_connect(endpoint_of(options_.server()), [this, &connection](beast::error_code error) {
      if (error) return fail_to_connect(connection);
      connection.socket.set_option(tcp::no_delay(true), error);
      write(connection);
    });
  }

  void write(Connection& connection) {
    net::async_write(connection.socket, net::buffer(request_), [this, &connection](beast::error_code error, std::size_t) {
      if (error) return fail(connection);
      read(connection);
    });
  }

  void read(Connection& connection) {
    connection.parser.emplace();
    connection.parser->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read(connection.socket, connection.buffer, *connection.parser,
                     [this, &connection](beast::error_code error, std::size_t) {
                       if (error) return fail(connection);
                       answered(connection);
                     });
  }

  void answered(Connection& connection) {
    --outstanding_;
    last_answer_ = Clock::now();
    latencies_ms_.push_back(milliseconds_between(connection.started, last_answer_));
    ++statuses_[static_cast<int>(connection.parser->get().result_int())];
    if (!connection.parser->keep_alive()) close(connection);
    next_request(connection);
  }

  void fail(Connection& connection) {
    --outstanding_;
    ++connection_errors_;
    close(connection);
    next_request(connection);
  }

  // A server that refuses connections would otherwise be retried in a tight loop.
  void fail_to_connect(Connection& connection) {
    --outstanding_;
    ++connection_errors_;
    close(connection);
    connection.retry.expires_after(kReconnectPause);
    connection.retry.async_wait([this, &connection](beast::error_code) { next_request(connection); });
  }

  static void close(Connection& connection) {
    beast::error_code ignored;
    connection.socket.close(ignored);
    connection.buffer.clear();
  }

  LoadResult result() {
    LoadResult result;
    result.concurrency = options_.concurrency();
    result.rate = options_.rate();
    result.seconds = std::max(milliseconds_between(start_, last_answer_) / 1000, options_.duration_seconds());
    result.requests = latencies_ms_.size();
    result.requests_per_second = static_cast<double>(result.requests) / result.seconds;
    result.latency = summarize_latencies(std::move(latencies_ms_));
    result.statuses = statuses_;
    result.connection_errors = connection_errors_;
    return result;
  }

  const LoadOptions& options_;
  const std::string request_;
  net::io_context io_{1};
  std::vector<std::unique_ptr<Connection>> connections_;
  Clock::time_point start_, deadline_, last_answer_;

  std::vector<double> arrivals_;
  std::size_t next_arrival_ = 0;
  std::deque<Clock::time_point> due_;  // arrived, waiting for a free connection
  std::vector<Connection*> idle_;
  net::steady_timer arrival_timer_;

  std::uint64_t outstanding_ = 0;
  std::uint64_t connection_errors_ = 0;
  std::vector<double> latencies_ms_;
  std::map<int, std::uint64_t> statuses_;
};

void fill_random(nlohmann::json& data, const std::string& datatype, std::int64_t count, std::mt19937_64& rng) {
  bool floating = datatype == "FP16" || datatype == "FP32" || datatype == "FP64";
  bool integer = datatype.rfind("INT", 0) == 0 || datatype.rfind("UINT", 0) == 0;
  if (!floating && !integer) {
    throw UsageError("metadata", "datatype " + datatype + " cannot be generated (FP16/32/64 and [U]INT8-64 can)");
  }
  std::uniform_real_distribution<double> real(0, 1);
  std::uniform_int_distribution<int> whole(0, 9);
  for (std::int64_t i = 0; i < count; ++i) {
    if (floating) {
      data.push_back(real(rng));
    } else {
      data.push_back(whole(rng));
    }
  }
}

}  // namespace

Endpoint parse_url(const std::string& url) {
  const std::string scheme = "http://";
  auto bad = [&](const std::string& why) {
    return UsageError("--url", "'" + url + "' " + why + " (expected http://HOST[:PORT] with HOST an IP address)");
  };
  if (url.rfind(scheme, 0) != 0) throw bad("does not start with http://");
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  Endpoint endpoint;
  std::size_t colon = rest.rfind(':');
  endpoint.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) > 65535) {
      throw bad("has a bad port");
    }
    endpoint.port = std::stoi(port);
  } else {
    endpoint.port = 80;
  }
  beast::error_code error;
  net::ip::make_address(endpoint.host, error);
  if (error) throw bad("has no IP address for a host");
  return endpoint;
}

std::string http_get(const Endpoint& server, const std::string& target) {
  const std::string url = url_of(server) + target;
  net::io_context io;
  tcp::socket socket(io);
  beast::error_code error;
  socket.connect(endpoint_of(server), error);
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, server.host);
  request.keep_alive(false);
  if (!error) http::write(socket, request, error);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!error) http::read(socket, buffer, response, error);
  if (error) throw Error(url + ": " + error.message());
  if (response.result_int() != 200) {
    throw Error(url + ": status " + std::to_string(response.result_int()) + ": " + response.body());
  }
  return response.body();
}

std::string sample_infer_body(const std::string& model_metadata, std::uint64_t seed) {
  nlohmann::json metadata = nlohmann::json::parse(model_metadata, nullptr, /*allow_exceptions=*/false);
  if (metadata.is_discarded()) throw UsageError("metadata", "not JSON");
  if (!metadata.contains("inputs") || !metadata["inputs"].is_array() || metadata["inputs"].empty()) {
    throw UsageError("metadata", "no inputs");
  }
  std::mt19937_64 rng(seed);
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& input : metadata["inputs"]) {
    if (!input.contains("name") || !input.contains("datatype") || !input.contains("shape") || !input["shape"].is_array()) {
      throw UsageError("metadata", "an input lacks name, datatype or shape");
    }
    nlohmann::json shape = nlohmann::json::array();
    std::int64_t count = 1;
    for (const auto& dim : input["shape"]) {
      std::int64_t size = dim.get<std::int64_t>() < 0 ? 1 : dim.get<std::int64_t>();
      shape.push_back(size);
      count *= size;
    }
    nlohmann::json data = nlohmann::json::array();
    fill_random(data, input["datatype"].get<std::string>(), count, rng);
    inputs.push_back({{"name", input["name"]}, {"shape", shape}, {"datatype", input["datatype"]}, {"data", data}});
  }
  return nlohmann::json{{"inputs", inputs}}.dump();
}

LatencySummary summarize_latencies(std::vector<double> latencies_ms) {
  LatencySummary summary;
  if (latencies_ms.empty()) return summary;
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto percentile = [&](double p) {
    auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(latencies_ms.size()) / 100));
    return latencies_ms[std::max<std::size_t>(rank, 1) - 1];
  };
  summary.p50_ms = percentile(50);
  summary.p90_ms = percentile(90);
  summary.p99_ms = percentile(99);
  summary.max_ms = latencies_ms.back();
  return summary;
}

std::vector<double> poisson_arrivals(double rate, double duration_seconds, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<double> arrivals;
  for (double t = gap(rng); t < duration_seconds; t += gap(rng)) arrivals.push_back(t);
  return arrivals;
}

LoadResult run_load(const LoadOptions& options) { return LoadRun(options).run(); }

}  // namespace afterburner::serve
