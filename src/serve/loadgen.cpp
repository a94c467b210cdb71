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
#include "afterburner/serve/protocol.h"
#include "load_run.h"

namespace afterburner::serve {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// Past the last arrival, answers are awaited for the timeout and this much more.
constexpr std::chrono::seconds kDrainMargin{1};
constexpr std::chrono::milliseconds kReconnectPause{10};

std::string url_of(const Endpoint& server) { return "http://" + server.host + ":" + std::to_string(server.port); }

tcp::endpoint endpoint_of(const Endpoint& server) {
  return {net::ip::make_address(server.host), static_cast<unsigned short>(server.port)};
}

std::string request_text(const LoadOptions& options) {
  std::string head = (options.body().empty() ? "GET " : "POST ") + options.target() +
                     " HTTP/1.1\r\nHost: " + options.server().host + ":" + std::to_string(options.server().port) + "\r\n";
  if (options.body().empty()) return head + "\r\n";
  if (options.json_length()) {
    head += "Content-Type: application/octet-stream\r\nInference-Header-Content-Length: " +
            std::to_string(*options.json_length()) + "\r\n";
  } else {
    head += "Content-Type: application/json\r\n";
  }
  return head + "Content-Length: " + std::to_string(options.body().size()) + "\r\n\r\n" + options.body();
}

double milliseconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

Clock::duration seconds(double value) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(value));
}

// One client thread: its connections on its own io_context, one request outstanding each.
class LoadRun {
 public:
  explicit LoadRun(LoadOptions options) : options_(std::move(options)), request_(request_text(options_)), arrival_timer_(io_) {
    if (open_loop()) arrivals_ = poisson_arrivals(options_.rate(), options_.duration_seconds(), options_.seed());
    for (int i = 0; i < options_.concurrency(); ++i) connections_.push_back(std::make_unique<Connection>(io_));
  }

  load::RunSamples run() {
    connect_all();
    start_ = last_answer_ = Clock::now();
    deadline_ = start_ + seconds(options_.duration_seconds());
    for (auto& connection : connections_) next_request(*connection);
    if (open_loop()) schedule_arrivals();
    io_.run_until(deadline_ + options_.timeout() + kDrainMargin);
    samples_.timeouts += outstanding_ + due_.size();  // never answered, or never sent
    samples_.seconds = std::max(milliseconds_between(start_, last_answer_) / 1000, options_.duration_seconds());
    return std::move(samples_);
  }

 private:
  struct Connection {
    explicit Connection(net::io_context& io) : socket(io), retry(io), deadline(io) {}
    tcp::socket socket;
    net::steady_timer retry;
    net::steady_timer deadline;  // the request's timeout
    beast::flat_buffer buffer;
    std::optional<http::response_parser<http::string_body>> parser;
    Clock::time_point started;  // when the request was due: the send time, or its arrival in open loop
    std::uint64_t sequence = 0;  // of the request in flight, so that a stale deadline is ignored
    bool in_flight = false;
    bool timed_out = false;  // closed by its deadline: its pending operation's error is a timeout
  };

  bool open_loop() const { return options_.rate() > 0; }

  // Every connection is opened before the clock starts, so that the load really holds them all
  // (in open loop, too: the arrivals go round them in turn) and no latency counts a handshake.
  // One that fails is tried again at its first request.
  void connect_all() {
    for (auto& connection : connections_) {
      connection->socket.async_connect(endpoint_of(options_.server()), [&connection = *connection](beast::error_code error) {
        if (error) return close(connection);
        connection.socket.set_option(tcp::no_delay(true), error);
      });
    }
    io_.run();
    io_.restart();
  }

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
      Connection* connection = idle_.front();
      idle_.pop_front();
      next_request(*connection);
    }
    if (next_arrival_ == arrivals_.size()) return;
    arrival_timer_.expires_at(arrival_time(next_arrival_));
    arrival_timer_.async_wait([this](beast::error_code error) {
      if (!error) schedule_arrivals();
    });
  }

  Clock::time_point arrival_time(std::size_t index) const { return start_ + seconds(arrivals_[index]); }

  void send(Connection& connection, Clock::time_point started) {
    connection.started = started;
    connection.in_flight = true;
    ++outstanding_;
    arm_deadline(connection);
    if (connection.socket.is_open()) return write(connection);
    connection.socket.async_connect(endpoint_of(options_.server()), [this, &connection](beast::error_code error) {
      if (error) return connection.timed_out ? time_out(connection) : fail_to_connect(connection);
      connection.socket.set_option(tcp::no_delay(true), error);
      write(connection);
    });
  }

  void arm_deadline(Connection& connection) {
    connection.deadline.expires_at(connection.started + options_.timeout());
    connection.deadline.async_wait([&connection, sequence = ++connection.sequence](beast::error_code error) {
      if (error || !connection.in_flight || sequence != connection.sequence) return;
      connection.timed_out = true;
      beast::error_code ignored;
      connection.socket.close(ignored);  // its pending operation completes with an error
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

  void finish(Connection& connection) {
    --outstanding_;
    connection.in_flight = false;
    connection.deadline.cancel();
  }

  void answered(Connection& connection) {
    finish(connection);
    last_answer_ = Clock::now();
    const double latency_ms = milliseconds_between(connection.started, last_answer_);
    const int status = static_cast<int>(connection.parser->get().result_int());
    samples_.latencies_ms.push_back(latency_ms);
    if (status / 100 == 2) samples_.accepted_ms.push_back(latency_ms);
    ++samples_.statuses[status];
    if (!connection.parser->keep_alive()) close(connection);
    next_request(connection);
  }

  void fail(Connection& connection) {
    if (connection.timed_out) return time_out(connection);
    finish(connection);
    ++samples_.connection_errors;
    close(connection);
    next_request(connection);
  }

  void time_out(Connection& connection) {
    finish(connection);
    ++samples_.timeouts;
    close(connection);
    next_request(connection);
  }

  // A server that refuses connections would otherwise be retried in a tight loop.
  void fail_to_connect(Connection& connection) {
    finish(connection);
    ++samples_.connection_errors;
    close(connection);
    connection.retry.expires_after(kReconnectPause);
    connection.retry.async_wait([this, &connection](beast::error_code) { next_request(connection); });
  }

  static void close(Connection& connection) {
    beast::error_code ignored;
    connection.socket.close(ignored);
    connection.buffer.clear();
    connection.timed_out = false;
  }

  const LoadOptions options_;
  const std::string request_;
  net::io_context io_{1};
  std::vector<std::unique_ptr<Connection>> connections_;
  Clock::time_point start_, deadline_, last_answer_;

  std::vector<double> arrivals_;
  std::size_t next_arrival_ = 0;
  std::deque<Clock::time_point> due_;  // arrived, waiting for a free connection
  std::deque<Connection*> idle_;  // longest idle first
  net::steady_timer arrival_timer_;

  std::uint64_t outstanding_ = 0;
  load::RunSamples samples_;
};

}  // namespace

Endpoint parse_url(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return UsageError("--url", "'" + url + "' " + why +
                                   " (expected http://HOST[:PORT] or grpc://HOST[:PORT] with HOST an IP address)");
  };
  Endpoint endpoint;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
    endpoint.port = 80;
  } else if (url.rfind("grpc://", 0) == 0) {
    rest = url.substr(7);
    endpoint.port = 8001;
    endpoint.protocol = Protocol::grpc;
  } else {
    throw bad("does not start with http:// or grpc://");
  }
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::size_t colon = rest.rfind(':');
  endpoint.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) > 65535) {
      throw bad("has a bad port");
    }
    endpoint.port = std::stoi(port);
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

std::vector<NamedTensor> sample_inputs(const std::string& model_metadata, std::uint64_t seed) {
  nlohmann::json metadata = nlohmann::json::parse(model_metadata, nullptr, /*allow_exceptions=*/false);
  if (metadata.is_discarded()) throw UsageError("metadata", "not JSON");
  if (!metadata.contains("inputs") || !metadata["inputs"].is_array() || metadata["inputs"].empty()) {
    throw UsageError("metadata", "no inputs");
  }
  std::mt19937_64 rng(seed);
  std::vector<NamedTensor> inputs;
  for (const auto& input : metadata["inputs"]) {
    if (!input.contains("name") || !input.contains("datatype") || !input.contains("shape") || !input["shape"].is_array()) {
      throw UsageError("metadata", "an input lacks name, datatype or shape");
    }
    const std::string datatype = input["datatype"].get<std::string>();
    const std::optional<DataType> type = parse_datatype(datatype);
    if (!type || *type == DataType::BOOL) {
      throw UsageError("metadata", "datatype " + datatype + " cannot be generated (FP16/32/64 and [U]INT8-64 can)");
    }
    std::vector<int64_t> shape;
    for (const auto& dim : input["shape"]) shape.push_back(std::max<int64_t>(dim.get<int64_t>(), 1));
    at::Tensor values = at::empty(shape, at::kDouble);
    const bool floating = *type == DataType::FP16 || *type == DataType::FP32 || *type == DataType::FP64;
    std::uniform_real_distribution<double> real(0, 1);
    std::uniform_int_distribution<int> whole(0, 9);
    double* data = values.data_ptr<double>();
    for (int64_t i = 0; i < values.numel(); ++i) data[i] = floating ? real(rng) : whole(rng);
    inputs.emplace_back(input["name"].get<std::string>(), values.to(scalar_type(*type)));
  }
  return inputs;
}

std::string sample_infer_body(const std::string& model_metadata, std::uint64_t seed) {
  return encode_infer_request(sample_inputs(model_metadata, seed)).body;
}

std::pair<std::string, std::size_t> sample_binary_body(const std::string& model_metadata, std::uint64_t seed) {
  EncodedBody body = encode_infer_request(sample_inputs(model_metadata, seed),
                                          RequestOptions().binary_inputs(true).binary_outputs(true));
  return {std::move(body.body), *body.json_length};
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

LoadResult run_load(const LoadOptions& options) {
  if (options.server().protocol == Protocol::grpc) return load::run_threads(options, load::run_grpc);
  return load::run_threads(options, [](const LoadOptions& share) { return LoadRun(share).run(); });
}

}  // namespace afterburner::serve
