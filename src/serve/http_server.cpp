#include "afterburner/serve/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <utility>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/serve/image_input.h"
#include "afterburner/serve/protocol.h"

namespace afterburner::serve {
// Named rather than anonymous: HttpServer::Impl, which has linkage, derives from Server.
namespace http_detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kReadChunk = 16 << 10;
// How long a closing connection may keep sending what we will not read: closing a socket with
// unread input resets it, and the reset can overtake the error response we just sent.
constexpr std::chrono::milliseconds kLingerTimeout{1000};

std::string_view view(beast::string_view text) { return {text.data(), text.size()}; }

struct Route {
  enum Kind {
    not_found, live, ready, server_metadata, model_metadata, model_ready, infer, metrics,
    repository_index, load, unload,  // model control (Triton's repository extension)
    dashboard, dashboard_data
  };
  Route(Kind route, std::string_view model_name = {}, std::string_view model_version = {})
      : kind(route), model(model_name), version(model_version) {}

  Kind kind;
  std::string_view model;
  std::string_view version;

  // The routes that act rather than read.
  bool takes_post() const { return kind == infer || kind == repository_index || kind == load || kind == unload; }
};

// The first path segment of `rest` (up to '/' or the end), removed from `rest`.
std::string_view take_segment(std::string_view& rest) {
  const std::size_t slash = rest.find('/');
  const std::string_view segment = rest.substr(0, slash);
  rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  return segment;
}

bool remove_prefix(std::string_view& text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  text.remove_prefix(prefix.size());
  return true;
}

// /v2/models/{name}[/versions/{version}][/ready|/infer] and
// /v2/repository/index, /v2/repository/models/{name}/load|unload.
Route match_route(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/v2/health/live") return {Route::live};
  if (path == "/v2/health/ready") return {Route::ready};
  if (path == "/v2") return {Route::server_metadata};
  if (path == "/metrics") return {Route::metrics};
  if (path == "/dashboard") return {Route::dashboard};
  if (path == "/dashboard/data") return {Route::dashboard_data};
  if (path == "/v2/repository/index") return {Route::repository_index};
  if (remove_prefix(path, "/v2/repository/models/")) {
    const std::string_view model = take_segment(path);
    if (model.empty()) return {Route::not_found};
    if (path == "/load") return {Route::load, model};
    if (path == "/unload") return {Route::unload, model};
    return {Route::not_found};
  }
  if (!remove_prefix(path, "/v2/models/")) return {Route::not_found};
  const std::string_view model = take_segment(path);
  if (model.empty()) return {Route::not_found};
  std::string_view version;
  if (remove_prefix(path, "/versions/")) {
    version = take_segment(path);
    if (version.empty()) return {Route::not_found};
  }
  if (path.empty()) return {Route::model_metadata, model, version};
  if (path == "/ready") return {Route::model_ready, model, version};
  if (path == "/infer") return {Route::infer, model, version};
  return {Route::not_found};
}

// Inference-Header-Content-Length: the JSON part's length, which must fit in the body.
std::optional<std::size_t> parse_json_length(std::string_view text, std::size_t body_size) {
  std::size_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value > body_size) {
    return std::nullopt;
  }
  return value;
}

// The integer value of `name` in the target's query string; 0 (refused by the caller) when it is
// not a number, nullopt when absent.
std::optional<int64_t> query_integer(std::string_view target, std::string_view name) {
  const size_t question = target.find('?');
  if (question == std::string_view::npos) return std::nullopt;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    const std::string_view pair = query.substr(0, query.find('&'));
    query = pair.size() < query.size() ? query.substr(pair.size() + 1) : std::string_view{};
    if (pair.substr(0, name.size()) != name || pair.substr(name.size(), 1) != "=") continue;
    const std::string_view text = pair.substr(name.size() + 1);
    int64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    return error == std::errc() && end == text.data() + text.size() ? value : 0;
  }
  return std::nullopt;
}

class Session;

// Everything the server shares between its io threads; HttpServer::Impl is this.
class Server {
 public:
  Server(Service& service, HttpOptions options);

  int port() const { return port_; }
  void run();
  void stop();

  Service& service() { return service_; }
  net::io_context& io() { return io_; }
  const HttpOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }
  void forget(Session* session);
  // Takes `bytes` from the budget of request bodies held at once; false (nothing taken) when
  // they do not fit.
  bool reserve_body(std::size_t bytes);
  void release_body(std::size_t bytes) { pending_body_bytes_ -= bytes; }
  void count_response(int status);
  std::string http_metrics() const;

 private:
  void accept();
  void on_accept(beast::error_code error, tcp::socket socket);
  void admit(tcp::socket socket);
  void begin_stop();

  Service& service_;
  const HttpOptions options_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> pending_body_bytes_{0};

  mutable std::mutex sessions_mutex_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_;
  mutable std::mutex responses_mutex_;
  std::map<int, std::uint64_t> responses_by_status_;

  // Declared after the registry: destroying the io_context destroys pending handlers and the
  // sessions they own, which then leave the registry.
  net::io_context io_;
  net::strand<net::io_context::executor_type> accept_strand_{io_.get_executor()};
  tcp::acceptor acceptor_{accept_strand_};
  net::steady_timer accept_retry_{accept_strand_};
  int port_ = 0;
};

// One connection: read a request, answer it, repeat while keep-alive. All on its own strand;
// only the service's reply arrives from elsewhere, posted back onto the strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, tcp::socket socket) : server_(server), socket_(std::move(socket)) {}
  ~Session() {
    server_.release_body(reserved_body_);
    server_.forget(this);
  }

  void start() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] { self->await_request(); });
  }

  void reject() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->keep_alive_ = false;
      self->write(error_reply(503, "too many connections (max_connections " +
                                       std::to_string(self->server_.options().max_connections()) + ")"));
    });
  }

  // Idle and half-received connections close; a request being answered is finished first.
  void on_server_stop() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      if (self->state_ == State::idle || self->state_ == State::reading) self->close();
    });
  }

 private:
  enum class State { idle, reading, answering, writing, closing, closed };

  void await_request() {
    server_.release_body(std::exchange(reserved_body_, 0));  // the last request's body is answered
    if (server_.stopping()) return close();
    if (buffer_.size() > 0) return read_header();  // pipelined: the next request is already here
    state_ = State::idle;
    arm_deadline(server_.options().idle_timeout());
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code error, std::size_t bytes) {
                              self->buffer_.commit(bytes);
                              if (error) return self->close();
                              self->read_header();
                            });
  }

  void read_header() {
    state_ = State::reading;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.options().max_header_bytes()));
    parser_->body_limit(server_.options().max_body_bytes());
    arm_deadline(server_.options().read_timeout());
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code error, std::size_t) {
                              if (error) return self->on_read_error(error);
                              self->continue_body();
                            });
  }

  // curl and others send "Expect: 100-continue" before a large body and wait for the go-ahead.
  void continue_body() {
    const std::size_t body = parser_->content_length().value_or(server_.options().max_body_bytes());
    if (body > 0 && body <= server_.options().max_body_bytes()) {
      if (!server_.reserve_body(body)) {
        keep_alive_ = false;
        return write(error_reply(503, "server busy: request bodies over max_pending_body_bytes (" +
                                          std::to_string(server_.options().max_pending_body_bytes()) + ")"));
      }
      reserved_body_ = body;
    }
    const auto& request = parser_->get();
    if (parser_->is_done() || !beast::iequals(request[http::field::expect], "100-continue")) return read_body();
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(socket_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code error, std::size_t) {
      if (error) return self->close();
      self->read_body();
    });
  }

  void read_body() {
    if (parser_->is_done()) return answer();
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code error, std::size_t) {
      if (error) return self->on_read_error(error);
      self->answer();
    });
  }

  void on_read_error(beast::error_code error) {
    if (state_ == State::closed) return;
    const auto& options = server_.options();
    keep_alive_ = false;
    if (timed_out_) {
      return write(error_reply(408, "request not received within " + std::to_string(options.read_timeout().count()) + " ms"));
    }
    if (error == http::error::body_limit) {
      return write(error_reply(413, "request body over " + std::to_string(options.max_body_bytes()) + " bytes"));
    }
    if (error == http::error::header_limit) {
      return write(error_reply(431, "request header over " + std::to_string(options.max_header_bytes()) + " bytes"));
    }
    // A client that half-closes (shutdown(SHUT_WR)) mid-request may still be reading: answer it.
    if (error == http::error::partial_message) return write(error_reply(400, truncation()));
    bool malformed = error.category() == http::make_error_code(http::error::bad_method).category() &&
                     error != http::error::end_of_stream;
    if (!malformed) return close();  // the client went away
    write(error_reply(400, "malformed HTTP request: " + error.message()));
  }

  std::string truncation() const {
    if (!parser_->is_header_done()) return "truncated HTTP request: the connection ended inside the header";
    const auto length = parser_->content_length();
    if (!length) return "truncated HTTP request: the connection ended inside the chunked body";
    return "truncated HTTP request: the connection ended after " +
           std::to_string(*length - parser_->content_length_remaining().value_or(0)) + " of the " +
           std::to_string(*length) + " body bytes of its Content-Length";
  }

  void answer() {
    state_ = State::answering;
    disarm_deadline();
    Request& request = parser_->get();
    keep_alive_ = request.keep_alive();
    Route route = match_route(view(request.target()));
    if (route.kind == Route::not_found) {
      return write(error_reply(404, "no route for " + std::string(request.target())));
    }
    http::verb method = route.takes_post() ? http::verb::post : http::verb::get;
    if (request.method() != method) {
      Reply reply = error_reply(405, std::string(request.target()) + " takes " + std::string(http::to_string(method)));
      reply.headers.emplace_back("Allow", std::string(http::to_string(method)));
      return write(std::move(reply));
    }
    if (route.kind == Route::infer) return infer({route.model, route.version}, request);
    if (route.kind == Route::load || route.kind == Route::unload) return control(route);
    write(answer_query(route, request));
  }

  Reply answer_query(const Route& route, const Request& request) {
    Service& service = server_.service();
    try {
      switch (route.kind) {
        case Route::live:
          return service.live() ? Reply{200, "application/json", R"({"live":true})", {}} : error_reply(503, "server is not live");
        case Route::ready:
          return service.ready() ? Reply{200, "application/json", R"({"ready":true})", {}} : error_reply(503, "server is not ready");
        case Route::server_metadata: return service.server_metadata();
        case Route::model_metadata: return service.model_metadata({route.model, route.version});
        case Route::model_ready: return service.model_ready({route.model, route.version});
        case Route::repository_index: return service.repository_index(request.body());
        case Route::dashboard: return service.dashboard();
        case Route::dashboard_data: return service.dashboard_data();
        case Route::metrics: {
          Reply reply;
          reply.content_type = "text/plain; version=0.0.4";
          reply.body = service.metrics() + server_.http_metrics();
          return reply;
        }
        default: break;
      }
    } catch (const std::exception& e) {
      return error_reply(500, e.what());
    }
    return error_reply(500, "unhandled route");
  }

  // Loading a model takes seconds: the service answers from its own thread.
  void control(const Route& route) {
    ReplyCallback reply = reply_callback();
    try {
      Service& service = server_.service();
      route.kind == Route::load ? service.load_model(route.model, reply) : service.unload_model(route.model, reply);
    } catch (const std::exception& e) {
      reply(error_reply(500, e.what()));
    }
  }

  void infer(ModelRef model, Request& request) {
    const std::string_view content_type = view(request[http::field::content_type]);
    if (is_image_content_type(content_type) || is_multipart_content_type(content_type)) {
      return infer_images(model, request, content_type);
    }
    std::optional<std::size_t> json_length;
    auto header = request.find("Inference-Header-Content-Length");
    if (header != request.end()) {
      json_length = parse_json_length(view(header->value()), request.body().size());
      if (!json_length) {
        return write(error_reply(400, "Inference-Header-Content-Length: '" + std::string(header->value()) +
                                          "' is not a length within the " +
                                          std::to_string(request.body().size()) + "-byte body"));
      }
    }
    ReplyCallback reply = reply_callback();
    try {
      server_.service().infer(model, std::move(request.body()), json_length, reply);
    } catch (const std::exception& e) {
      reply(error_reply(500, e.what()));
    }
  }

  // One image as the body, or the parts of a multipart body; ?top_k=K (default kTopClasses).
  void infer_images(ModelRef model, Request& request, std::string_view content_type) {
    constexpr int64_t kTopClasses = 5;
    ReplyCallback reply = reply_callback();
    try {
      std::vector<std::string> images;
      if (is_image_content_type(content_type)) {
        images.push_back(std::move(request.body()));
      } else {
        images = multipart_parts(request.body(), content_type);
      }
      const std::optional<int64_t> top_k = query_integer(view(request.target()), "top_k");
      if (top_k && *top_k < 1) return reply(error_reply(400, "top_k must be a positive integer"));
      server_.service().infer_images(model, std::move(images), top_k.value_or(kTopClasses), reply);
    } catch (const RequestError& e) {
      reply(error_reply(e.status(), e.what()));
    } catch (const std::exception& e) {
      reply(error_reply(500, e.what()));
    }
  }

  // The service may answer from any thread, and must answer exactly once; a second answer (say
  // an exception after the reply) is dropped. Until it answers, the io_context keeps running.
  // The answering thread sends the response itself when the socket takes it at once (the usual
  // case): posted to the io thread, it would wait behind every connection's reads, which under
  // load is most of a request's latency. The rest (counting, the next request, a response the
  // socket could not take whole) continues on the session's strand. While a session awaits its
  // answer nothing else uses its socket: no read or write is pending, and its deadline is off.
  // Answering hands the session and the io_context's work to the posted continuation: copies of
  // the callback the service drops later (its batcher's thread, after the server may be gone)
  // hold neither.
  ReplyCallback reply_callback() {
    struct Pending {
      Pending(std::shared_ptr<Session> owner, net::io_context& io)
          : session(std::move(owner)), work(net::make_work_guard(io)) {}
      std::shared_ptr<Session> session;
      net::executor_work_guard<net::io_context::executor_type> work;
      std::atomic<bool> answered{false};
    };
    auto pending = std::make_shared<Pending>(shared_from_this(), server_.io());
    return [pending](Reply reply) {
      if (pending->answered.exchange(true)) return;
      {
        // The session's strand executor goes before the work guard: once the guard is released
        // the server may finish and destroy the io_context, and with it the strand service that
        // an executor's destructor locks (AddressSanitizer caught that order, a use after free).
        std::shared_ptr<Session> session = std::move(pending->session);
        const auto executor = session->socket_.get_executor();
        Outgoing out = session->serialize(std::move(reply));
        out.sent = send_now(session->socket_.native_handle(), out.text);
        net::post(executor, [session = std::move(session), out = std::move(out)]() mutable {
          session->finish_write(std::move(out));
        });
      }
      pending->work.reset();  // the posted continuation keeps the io_context running until it runs
    };
  }

  // A response as bytes, and how many of them are already sent (-1: the socket failed).
  struct Outgoing {
    int status = 0;
    bool keep_alive = false;
    std::string text;
    std::ptrdiff_t sent = 0;
  };

  // Reads only what is fixed while the request is answered (keep_alive_) and atomics.
  Outgoing serialize(Reply reply) const {
    Outgoing out;
    out.status = reply.status;
    out.keep_alive = keep_alive_ && !server_.stopping();
    const auto status = static_cast<http::status>(reply.status);
    out.text.reserve(128 + reply.body.size());
    out.text.append("HTTP/1.1 ").append(std::to_string(reply.status)).append(" ");
    out.text.append(view(http::obsolete_reason(status))).append("\r\nContent-Type: ").append(reply.content_type);
    for (const auto& [name, value] : reply.headers) out.text.append("\r\n").append(name).append(": ").append(value);
    out.text.append("\r\nContent-Length: ").append(std::to_string(reply.body.size()));
    if (!out.keep_alive) out.text.append("\r\nConnection: close");
    out.text.append("\r\n\r\n").append(reply.body);
    return out;
  }

  // What a non-blocking send takes now: all of `text`, part, nothing (0), or -1 on error.
  static std::ptrdiff_t send_now(int fd, const std::string& text) {
    for (;;) {
      const ssize_t sent = ::send(fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent >= 0) return sent;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
  }

  void write(Reply reply) { finish_write(serialize(std::move(reply))); }

  // On the strand: sends what is left of `out`, then the next request (or the close).
  void finish_write(Outgoing out) {
    if (state_ == State::closed) return;
    state_ = State::writing;
    server_.count_response(out.status);
    if (out.sent < 0) return close();
    outgoing_ = std::move(out);
    if (static_cast<std::size_t>(outgoing_.sent) == outgoing_.text.size()) return after_write();
    arm_deadline(server_.options().read_timeout());
    const auto rest = net::buffer(outgoing_.text) + static_cast<std::size_t>(outgoing_.sent);
    net::async_write(socket_, rest, [self = shared_from_this()](beast::error_code error, std::size_t) {
      if (error) return self->close();
      self->after_write();
    });
  }

  void after_write() {
    if (!outgoing_.keep_alive) return linger_close();
    await_request();
  }

  void linger_close() {
    state_ = State::closing;
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    arm_deadline(std::min(kLingerTimeout, server_.options().read_timeout()));
    discard_input();
  }

  void discard_input() {
    buffer_.clear();
    socket_.async_read_some(buffer_.prepare(kReadChunk), [self = shared_from_this()](beast::error_code error, std::size_t) {
      if (error) return self->close();
      self->discard_input();
    });
  }

  void close() {
    if (state_ == State::closed) return;
    state_ = State::closed;
    disarm_deadline();
    timer_.cancel();  // its pending wait holds the session
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // One timer per connection, moved only when it fires or a deadline comes sooner than it: a
  // keep-alive connection's requests each set a deadline without cancelling and restarting a
  // timer (a cancelled wait is a handler of its own). The timer never runs more than the
  // shortest timeout ahead, so the deadlines of a request (later than that) never move it.
  void arm_deadline(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    const Clock::time_point now = Clock::now();
    deadline_ = now + timeout;
    if (!timer_waiting_ || deadline_ < timer_.expiry()) start_timer(std::min(deadline_, now + shortest_timeout()));
  }

  void disarm_deadline() { deadline_ = Clock::time_point::max(); }

  void start_timer(Clock::time_point at) {
    timer_waiting_ = true;
    timer_.expires_at(at);  // a wait already pending completes as cancelled
    timer_.async_wait([self = shared_from_this()](beast::error_code error) {
      if (error) return;
      self->timer_waiting_ = false;
      self->on_timer();
    });
  }

  // Cancelling (not closing) the socket on expiry leaves it open for a 408.
  void on_timer() {
    if (state_ == State::closed || deadline_ == Clock::time_point::max()) return;
    const Clock::time_point now = Clock::now();
    if (now < deadline_) return start_timer(std::min(deadline_, now + shortest_timeout()));
    timed_out_ = true;
    beast::error_code ignored;
    socket_.cancel(ignored);
  }

  std::chrono::milliseconds shortest_timeout() const {
    return std::min(server_.options().read_timeout(), server_.options().idle_timeout());
  }

  Server& server_;
  tcp::socket socket_;
  net::steady_timer timer_{socket_.get_executor()};
  bool timer_waiting_ = false;
  Clock::time_point deadline_ = Clock::time_point::max();  // max: none
  bool timed_out_ = false;
  State state_ = State::idle;
  bool keep_alive_ = true;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::size_t reserved_body_ = 0;  // of the server's body budget, for the request being handled
  Outgoing outgoing_;  // the response being written
};

Server::Server(Service& service, HttpOptions options)
    : service_(service), options_(std::move(options)), io_(std::max(options_.io_threads(), 1)) {
  if (options_.port() < 0 || options_.port() > 65535) {
    throw UsageError("port", std::to_string(options_.port()) + " is not a port number (0-65535)");
  }
  if (options_.io_threads() < 1) throw UsageError("io_threads", "must be at least 1");
  if (options_.max_connections() < 1) throw UsageError("max_connections", "must be at least 1");
  if (options_.read_timeout().count() <= 0) throw UsageError("read_timeout", "must be positive");
  if (options_.idle_timeout().count() <= 0) throw UsageError("idle_timeout", "must be positive");
  beast::error_code error;
  auto address = net::ip::make_address(options_.host(), error);
  if (error) throw UsageError("host", "'" + options_.host() + "' is not an IP address");
  tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port()));
  const std::string where = options_.host() + ":" + std::to_string(options_.port());
  acceptor_.open(endpoint.protocol(), error);
  if (!error) acceptor_.set_option(net::socket_base::reuse_address(true), error);
  if (!error) acceptor_.bind(endpoint, error);
  if (!error) acceptor_.listen(net::socket_base::max_listen_connections, error);
  if (!error) acceptor_.non_blocking(true, error);
  if (error) throw Error(where + ": cannot listen: " + error.message());
  port_ = acceptor_.local_endpoint().port();
}

void Server::run() {
  net::post(accept_strand_, [this] { accept(); });
  std::vector<std::thread> helpers;
  for (int i = 1; i < options_.io_threads(); ++i) helpers.emplace_back([this] { io_.run(); });
  io_.run();
  for (auto& helper : helpers) helper.join();
}

void Server::stop() {
  net::post(accept_strand_, [this] { begin_stop(); });
}

void Server::begin_stop() {
  if (stopping_.exchange(true)) return;
  beast::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    for (auto& [raw, weak] : sessions_) {
      if (auto session = weak.lock()) open.push_back(std::move(session));
    }
  }
  for (auto& session : open) session->on_server_stop();
}

void Server::accept() {
  if (stopping_) return;
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code error, tcp::socket socket) {
    on_accept(error, std::move(socket));
  });
}

// Takes every connection already waiting, not one per turn of the io loop: behind a thousand busy
// connections a turn is long, and connections accepted one a turn would wait seconds for it.
void Server::on_accept(beast::error_code error, tcp::socket socket) {
  if (stopping_) return;
  while (!error) {
    admit(std::move(socket));
    socket = tcp::socket(net::make_strand(io_));
    acceptor_.accept(socket, error);  // non-blocking: would_block once the backlog is empty
  }
  if (error == net::error::would_block || error == net::error::try_again) return accept();
  // Out of file descriptors, say: pause rather than spin on an accept that fails at once.
  accept_retry_.expires_after(std::chrono::milliseconds(50));
  accept_retry_.async_wait([this](beast::error_code wait_error) {
    if (!wait_error) accept();
  });
}

void Server::admit(tcp::socket socket) {
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  auto session = std::make_shared<Session>(*this, std::move(socket));
  bool admitted;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    admitted = sessions_.size() < options_.max_connections();
    if (admitted) sessions_.emplace(session.get(), session);
  }
  if (admitted) {
    session->start();
  } else {
    session->reject();
  }
}

bool Server::reserve_body(std::size_t bytes) {
  std::size_t held = pending_body_bytes_.load();
  do {
    if (bytes > options_.max_pending_body_bytes() - std::min(held, options_.max_pending_body_bytes())) return false;
  } while (!pending_body_bytes_.compare_exchange_weak(held, held + bytes));
  return true;
}

void Server::forget(Session* session) {
  std::lock_guard<std::mutex> lock(sessions_mutex_);
  sessions_.erase(session);
}

void Server::count_response(int status) {
  std::lock_guard<std::mutex> lock(responses_mutex_);
  ++responses_by_status_[status];
}

std::string Server::http_metrics() const {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(sessions_mutex_);
    text += "# HELP afterburner_http_connections Open HTTP connections.\n"
            "# TYPE afterburner_http_connections gauge\n"
            "afterburner_http_connections " + std::to_string(sessions_.size()) + "\n";
  }
  text += "# HELP afterburner_http_responses_total HTTP responses by status code.\n"
          "# TYPE afterburner_http_responses_total counter\n";
  std::lock_guard<std::mutex> lock(responses_mutex_);
  for (auto [status, count] : responses_by_status_) {
    text += "afterburner_http_responses_total{code=\"" + std::to_string(status) + "\"} " + std::to_string(count) + "\n";
  }
  return text;
}

}  // namespace http_detail

struct HttpServer::Impl : http_detail::Server {
  using Server::Server;
};

HttpServer::HttpServer(Service& service, HttpOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port(); }

void HttpServer::run() { impl_->run(); }

void HttpServer::stop() { impl_->stop(); }

}  // namespace afterburner::serve
