#include "afterburner/serve/http_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "afterburner/core/error.h"
#include "running_server.h"
#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::serve::testing::RunningServer;

using afterburner::testing::Contains;
using afterburner::testing::error_message;
using namespace std::chrono_literals;

// Echoes infer bodies back; model "late" parks its reply for the test to send from its own
// thread; model "boom" throws.
class TestService : public Service {
 public:
  bool live() const override { return true; }
  bool ready() const override { return ready_; }
  Reply server_metadata() const override { return json(R"({"name":"test-service"})"); }
  Reply model_metadata(ModelRef model) const override {
    nlohmann::json metadata{{"name", model.name}};
    if (!model.version.empty()) metadata["version"] = model.version;
    return json(metadata.dump());
  }
  Reply model_ready(ModelRef model) const override {
    if (model.name == "cnn") return json(R"({"ready":true})");
    return Reply{404, "application/json", R"({"error":"no model )" + std::string(model.name) + R"("})", {}};
  }
  void infer(ModelRef model, std::string body, std::optional<std::size_t> json_length, ReplyCallback reply) override {
    if (model.name == "boom") throw std::runtime_error("model boom exploded");
    Reply echo = json(std::string(model.name) + ":" + body);
    if (json_length) echo.headers.emplace_back("X-Json-Length", std::to_string(*json_length));
    if (model.name != "late") return reply(std::move(echo));
    std::lock_guard<std::mutex> lock(mutex_);
    parked_.push_back([reply, echo] { reply(echo); });
    parked_changed_.notify_all();
  }
  std::string metrics() const override { return "test_requests_total 7\n"; }

  void set_ready(bool ready) { ready_ = ready; }
  // Blocks until `count` late requests have reached the service.
  void wait_for_parked(std::size_t count) {
    std::unique_lock<std::mutex> lock(mutex_);
    parked_changed_.wait(lock, [&] { return parked_.size() >= count; });
  }
  void release_parked() {
    std::vector<std::function<void()>> replies;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      replies.swap(parked_);
    }
    for (auto& reply : replies) reply();
  }

 private:
  static Reply json(std::string body) { return Reply{200, "application/json", std::move(body), {}}; }

  std::atomic<bool> ready_{true};
  std::mutex mutex_;
  std::condition_variable parked_changed_;
  std::vector<std::function<void()>> parked_;
};

// A server on an ephemeral loopback port, running on its own thread for the test's lifetime.
struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// A blocking loopback client on plain sockets, so the test shares no code with the server.
// Every receive times out after 10 s: a server that hangs fails the test instead of hanging it.
class Client {
 public:
  explicit Client(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error("socket failed");
    timeval timeout{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      throw std::runtime_error("connect failed");
    }
  }
  ~Client() { close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send_raw(const std::string& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may close early (413); the response is still readable
      sent += static_cast<std::size_t>(n);
    }
  }

  // shutdown(SHUT_WR): the server reads the end of the request stream, the client can still read.
  void half_close() { ::shutdown(fd_, SHUT_WR); }

  Response request(const std::string& method, const std::string& target, const std::string& body = "",
                   const std::string& extra_headers = "") {
    send_raw(request_text(method, target, body, extra_headers));
    return read_response();
  }

  static std::string request_text(const std::string& method, const std::string& target,
                                  const std::string& body = "", const std::string& extra_headers = "") {
    return method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n" + extra_headers + "\r\n" + body;
  }

  Response read_response() {
    std::size_t header_end;
    while ((header_end = pending_.find("\r\n\r\n")) == std::string::npos) {
      if (!receive()) throw std::runtime_error("connection closed before a response header: '" + pending_ + "'");
    }
    Response response;
    std::string head = pending_.substr(0, header_end);
    pending_.erase(0, header_end + 4);
    response.status = std::stoi(head.substr(9, 3));
    std::size_t line_start = head.find("\r\n");
    while (line_start != std::string::npos) {
      std::size_t next = head.find("\r\n", line_start + 2);
      std::string line = head.substr(line_start + 2, next == std::string::npos ? std::string::npos : next - line_start - 2);
      std::size_t colon = line.find(':');
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      response.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
      line_start = next;
    }
    auto length_header = response.headers.find("content-length");
    std::size_t length = length_header == response.headers.end() ? 0 : std::stoul(length_header->second);
    while (pending_.size() < length) {
      if (!receive()) throw std::runtime_error("connection closed inside a response body");
    }
    response.body = pending_.substr(0, length);
    pending_.erase(0, length);
    return response;
  }

  // True when the server has closed the connection (reads end), false when it stays open
  // with nothing to read for `wait`.
  bool closed_by_server(std::chrono::milliseconds wait = 10s) {
    timeval timeout{static_cast<long>(wait.count() / 1000), static_cast<long>(wait.count() % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char byte;
    ssize_t n = recv(fd_, &byte, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  bool receive() {
    char chunk[16384];
    ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    pending_.append(chunk, static_cast<std::size_t>(n));
    return true;
  }

  int fd_;
  std::string pending_;
};

TEST(HttpServer, HealthRoutesFollowTheService) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response live = client.request("GET", "/v2/health/live");
  EXPECT_EQ(live.status, 200);
  EXPECT_EQ(live.body, R"({"live":true})");
  EXPECT_EQ(live.headers["content-type"], "application/json");
  EXPECT_EQ(client.request("GET", "/v2/health/ready").status, 200);
  service.set_ready(false);
  Response not_ready = client.request("GET", "/v2/health/ready");
  EXPECT_EQ(not_ready.status, 503);
  EXPECT_EQ(not_ready.body, R"({"error":"server is not ready"})");
}

TEST(HttpServer, MetadataRoutesReachTheService) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  EXPECT_EQ(client.request("GET", "/v2").body, R"({"name":"test-service"})");
  EXPECT_EQ(client.request("GET", "/v2/models/cnn").body, R"({"name":"cnn"})");
  EXPECT_EQ(client.request("GET", "/v2/models/cnn?verbose=1").body, R"({"name":"cnn"})");
  EXPECT_EQ(client.request("GET", "/v2/models/cnn/versions/7").body, R"({"name":"cnn","version":"7"})");
  EXPECT_EQ(client.request("GET", "/v2/models/cnn/ready").body, R"({"ready":true})");
  EXPECT_EQ(client.request("GET", "/v2/models/cnn/versions/2/ready").body, R"({"ready":true})");
  EXPECT_EQ(client.request("POST", "/v2/models/cnn/versions/2/infer", "{}").body, "cnn:{}");
  Response unknown = client.request("GET", "/v2/models/mlp/ready");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body, R"({"error":"no model mlp"})");
  for (std::string path : {"/v2/models/cnn/versions/", "/v2/models/cnn/versions//ready", "/v2/models/cnn/versions/2/x"}) {
    EXPECT_EQ(client.request("GET", path).status, 404) << path;
  }
}

// A service without a repository answers the model-control routes with 501; they take POST.
TEST(HttpServer, RepositoryRoutesReachTheService) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response index = client.request("POST", "/v2/repository/index", "{}");
  EXPECT_EQ(index.status, 501);
  EXPECT_EQ(index.body, R"({"error":"this server has no model repository"})");
  Response load = client.request("POST", "/v2/repository/models/cnn/load", "");
  EXPECT_EQ(load.status, 501);
  EXPECT_EQ(load.body, R"({"error":"model 'cnn': this server cannot load models"})");
  EXPECT_EQ(client.request("POST", "/v2/repository/models/cnn/unload", "").body,
            R"({"error":"model 'cnn': this server cannot unload models"})");
  EXPECT_EQ(client.request("GET", "/v2/repository/models/cnn/load").status, 405);
  EXPECT_EQ(client.request("POST", "/v2/repository/models//load", "").status, 404);
  EXPECT_EQ(client.request("POST", "/v2/repository/models/cnn/reload", "").status, 404);
}

TEST(HttpServer, InferPassesModelBodyAndJsonLength) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response plain = client.request("POST", "/v2/models/cnn/infer", R"({"inputs":[]})");
  EXPECT_EQ(plain.status, 200);
  EXPECT_EQ(plain.body, R"(cnn:{"inputs":[]})");
  EXPECT_EQ(plain.headers.count("x-json-length"), 0u);
  std::string binary = std::string(R"({"inputs":[]})") + std::string("\0\x01\x02\x03", 4);
  Response split = client.request("POST", "/v2/models/cnn/infer", binary, "Inference-Header-Content-Length: 13\r\n");
  EXPECT_EQ(split.status, 200);
  EXPECT_EQ(split.body, "cnn:" + binary);
  EXPECT_EQ(split.headers["x-json-length"], "13");
}

TEST(HttpServer, BadInferenceHeaderContentLengthIs400) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  for (std::string value : {"abc", "-1", "12x", "99", ""}) {
    Response response = client.request("POST", "/v2/models/cnn/infer", R"({"inputs":[]})",
                                       "Inference-Header-Content-Length: " + value + "\r\n");
    EXPECT_EQ(response.status, 400) << value;
    EXPECT_TRUE(Contains(response.body, R"({"error":"Inference-Header-Content-Length: ')" + value + "'"));
  }
  EXPECT_EQ(client.request("GET", "/v2/health/live").status, 200);  // the connection stays usable
}

TEST(HttpServer, MetricsJoinServiceAndHttpCounters) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  client.request("GET", "/nowhere");
  Response metrics = client.request("GET", "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.headers["content-type"], "text/plain; version=0.0.4");
  EXPECT_TRUE(Contains(metrics.body, "test_requests_total 7\n"));
  EXPECT_TRUE(Contains(metrics.body, "afterburner_http_connections 1\n"));
  EXPECT_TRUE(Contains(metrics.body, "afterburner_http_responses_total{code=\"404\"} 1\n"));
}

TEST(HttpServer, UnknownPathsAre404AndWrongMethods405) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  for (std::string path : {"/", "/v1/models/cnn", "/v2/models/", "/v2/models/cnn/predict", "/v2/health"}) {
    Response response = client.request("GET", path);
    EXPECT_EQ(response.status, 404) << path;
    EXPECT_EQ(response.body, R"({"error":"no route for )" + path + R"("})");
  }
  Response get_infer = client.request("GET", "/v2/models/cnn/infer");
  EXPECT_EQ(get_infer.status, 405);
  EXPECT_EQ(get_infer.headers["allow"], "POST");
  EXPECT_EQ(get_infer.body, R"({"error":"/v2/models/cnn/infer takes POST"})");
  Response post_live = client.request("POST", "/v2/health/live", "{}");
  EXPECT_EQ(post_live.status, 405);
  EXPECT_EQ(post_live.headers["allow"], "GET");
}

TEST(HttpServer, TargetThatIsNoUtf8Is404WithAJsonBody) {
  // Found by fuzzing: the 404 message quotes the target, and serializing its byte 0xff as JSON
  // threw on the server's thread and ended the process.
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response response = client.request("GET", "/\xff\xfe/x\"y");
  EXPECT_EQ(response.status, 404);
  EXPECT_EQ(response.body, R"({"error":"no route for /\ufffd\ufffd/x\"y"})");
  EXPECT_EQ(client.request("GET", "/v2/health/live").status, 200);
}

TEST(HttpServer, ServiceExceptionIs500AndTheConnectionLives) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response response = client.request("POST", "/v2/models/boom/infer", "{}");
  EXPECT_EQ(response.status, 500);
  EXPECT_EQ(response.body, R"({"error":"model boom exploded"})");
  EXPECT_EQ(client.request("POST", "/v2/models/cnn/infer", "x").body, "cnn:x");
}

TEST(HttpServer, KeepAliveServesManyRequestsOnOneConnection) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  for (int i = 0; i < 500; ++i) {
    Response response = client.request("POST", "/v2/models/cnn/infer", std::to_string(i));
    ASSERT_EQ(response.body, "cnn:" + std::to_string(i));
    ASSERT_EQ(response.headers.count("connection"), 0u);  // HTTP/1.1 keeps alive by default
  }
  Response last = client.request("GET", "/metrics");
  EXPECT_TRUE(Contains(last.body, "afterburner_http_connections 1\n"));
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  client.send_raw(Client::request_text("POST", "/v2/models/cnn/infer", "a") +
                  Client::request_text("GET", "/v2/models/cnn") +
                  Client::request_text("POST", "/v2/models/cnn/infer", "b"));
  EXPECT_EQ(client.read_response().body, "cnn:a");
  EXPECT_EQ(client.read_response().body, R"({"name":"cnn"})");
  EXPECT_EQ(client.read_response().body, "cnn:b");
}

TEST(HttpServer, ConnectionCloseIsHonoured) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  Response response = client.request("GET", "/v2/health/live", "", "Connection: close\r\n");
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.headers["connection"], "close");
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpServer, BodyOverTheLimitIs413AndTheServerStaysUp) {
  TestService service;
  RunningServer running(service, HttpOptions().max_body_bytes(1000));
  {
    Client client(running.port());
    Response response = client.request("POST", "/v2/models/cnn/infer", std::string(5000, 'x'));
    EXPECT_EQ(response.status, 413);
    EXPECT_EQ(response.body, R"({"error":"request body over 1000 bytes"})");
    EXPECT_EQ(response.headers["connection"], "close");
    EXPECT_TRUE(client.closed_by_server());
  }
  {
    Client client(running.port());  // chunked: no Content-Length to check up front
    client.send_raw("POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "3e8\r\n" + std::string(1000, 'y') + "\r\n3e8\r\n" + std::string(1000, 'y') + "\r\n0\r\n\r\n");
    EXPECT_EQ(client.read_response().status, 413);
  }
  Client client(running.port());
  EXPECT_EQ(client.request("POST", "/v2/models/cnn/infer", std::string(1000, 'z')).status, 200);
}

TEST(HttpServer, ExpectContinueGetsTheGoAhead) {
  TestService service;
  RunningServer running(service);
  Client client(running.port());
  client.send_raw("POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  EXPECT_EQ(client.read_response().status, 100);  // no body, so it parses like a response
  client.send_raw("ok");
  EXPECT_EQ(client.read_response().body, "cnn:ok");
}

TEST(HttpServer, MalformedRequestsAre400AndTheServerStaysUp) {
  TestService service;
  RunningServer running(service);
  for (std::string garbage : {"GARBAGE\r\n\r\n", "GET /v2 HTTX/1.1\r\n\r\n", "GET /v2 HTTP/1.1\r\nno colon here\r\n\r\n",
                              "POST /v2/models/cnn/infer HTTP/1.1\r\nContent-Length: nope\r\n\r\n"}) {
    Client client(running.port());
    client.send_raw(garbage);
    Response response = client.read_response();
    EXPECT_EQ(response.status, 400) << garbage;
    EXPECT_TRUE(Contains(response.body, R"({"error":"malformed HTTP request: )")) << garbage;
    EXPECT_TRUE(client.closed_by_server());
  }
  Client client(running.port());
  EXPECT_EQ(client.request("GET", "/v2/health/live").status, 200);
}

// A client that half-closes before sending what it announced still reads the 400.
TEST(HttpServer, RequestCutShortByAHalfCloseIs400AndTheServerStaysUp) {
  TestService service;
  RunningServer running(service);
  const std::string truncated = "truncated HTTP request: the connection ended ";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nonly 13 bytes",
       "after 13 of the 100 body bytes of its Content-Length"},
      {"POST /v2/models/cnn/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n",
       "after 0 of the 100 body bytes of its Content-Length"},
      {"POST /v2/models/cnn/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "inside the chunked body"},
      {"GET /v2/health/live HTTP/1.1\r\nHost:", "inside the header"}};
  for (const auto& [request, problem] : cases) {
    Client client(running.port());
    client.send_raw(request);
    client.half_close();
    Response response = client.read_response();
    EXPECT_EQ(response.status, 400) << request;
    EXPECT_EQ(response.body, R"({"error":")" + truncated + problem + R"("})") << request;
    EXPECT_TRUE(client.closed_by_server()) << request;
  }
  Client client(running.port());
  EXPECT_EQ(client.request("GET", "/v2/health/live").status, 200);
}

TEST(HttpServer, HeaderOverTheLimitIs431) {
  TestService service;
  RunningServer running(service, HttpOptions().max_header_bytes(1024));
  Client client(running.port());
  Response response = client.request("GET", "/v2", "", "X-Padding: " + std::string(2000, 'p') + "\r\n");
  EXPECT_EQ(response.status, 431);
  EXPECT_EQ(response.body, R"({"error":"request header over 1024 bytes"})");
}

TEST(HttpServer, StalledClientGets408WhileOthersAreServed) {
  TestService service;
  RunningServer running(service, HttpOptions().read_timeout(std::chrono::milliseconds(300)));
  Client stalled(running.port());
  stalled.send_raw("GET /v2/health/live HTTP/1.1\r\nHost:");
  Client other(running.port());
  for (int i = 0; i < 20; ++i) ASSERT_EQ(other.request("GET", "/v2/health/live").status, 200);
  Response response = stalled.read_response();
  EXPECT_EQ(response.status, 408);
  EXPECT_EQ(response.body, R"({"error":"request not received within 300 ms"})");
  EXPECT_TRUE(stalled.closed_by_server());
  EXPECT_EQ(other.request("GET", "/v2/health/live").status, 200);
}

// Each request moves the connection's deadline: a busy keep-alive connection outlives the read
// timeout many times over, and a request that then stalls still gets its 408 on time.
TEST(HttpServer, DeadlinesFollowEachRequestOfAKeepAliveConnection) {
  TestService service;
  RunningServer running(service, HttpOptions().read_timeout(std::chrono::milliseconds(200)));
  Client client(running.port());
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(700)) {
    ASSERT_EQ(client.request("GET", "/v2/health/live").status, 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  client.send_raw("GET /v2/health/live HTTP/1.1\r\nHost:");
  const auto stalled = std::chrono::steady_clock::now();
  Response response = client.read_response();
  const auto waited = std::chrono::steady_clock::now() - stalled;
  EXPECT_EQ(response.status, 408);
  // Not before the deadline (clock granularity aside); a 408 never sent fails the read (SO_RCVTIMEO).
  EXPECT_GE(waited, std::chrono::milliseconds(190));
}

TEST(HttpServer, IdleKeepAliveConnectionIsClosed) {
  TestService service;
  RunningServer running(service, HttpOptions().idle_timeout(std::chrono::milliseconds(500)));
  Client client(running.port());
  EXPECT_EQ(client.request("GET", "/v2/health/live").status, 200);
  EXPECT_TRUE(client.closed_by_server());
}

TEST(HttpServer, ConnectionsOverTheLimitAre503) {
  TestService service;
  RunningServer running(service, HttpOptions().max_connections(2));
  Client first(running.port()), second(running.port());
  EXPECT_EQ(first.request("GET", "/v2/health/live").status, 200);
  EXPECT_EQ(second.request("GET", "/v2/health/live").status, 200);
  Client third(running.port());
  Response rejected = third.read_response();
  EXPECT_EQ(rejected.status, 503);
  EXPECT_EQ(rejected.body, R"j({"error":"too many connections (max_connections 2)"})j");
  EXPECT_TRUE(third.closed_by_server());
  EXPECT_EQ(first.request("GET", "/v2/health/live").status, 200);
}

// One slow upload holds its declared body against the budget of all connections together:
// what does not fit is refused before its body is read, what fits is served, and the bytes
// come back once the upload is answered.
TEST(HttpServer, BodiesOverTheServerBudgetAre503) {
  TestService service;
  RunningServer running(service, HttpOptions().max_body_bytes(1000).max_pending_body_bytes(1500));
  Client uploader(running.port());
  uploader.send_raw("POST /v2/models/cnn/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" +
                    std::string(300, 'u'));
  Response refused = Client(running.port()).request("POST", "/v2/models/cnn/infer", std::string(800, 'r'));
  for (int i = 0; i < 50 && refused.status == 200; ++i) {  // until the server has read the uploader's header
    std::this_thread::sleep_for(10ms);
    refused = Client(running.port()).request("POST", "/v2/models/cnn/infer", std::string(800, 'r'));
  }
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.body, R"j({"error":"server busy: request bodies over max_pending_body_bytes (1500)"})j");
  EXPECT_EQ(Client(running.port()).request("POST", "/v2/models/cnn/infer", std::string(400, 's')).status, 200);
  uploader.send_raw(std::string(700, 'u'));
  EXPECT_EQ(uploader.read_response().status, 200);
  EXPECT_EQ(uploader.request("GET", "/v2/health/live").status, 200);  // the upload's bytes are back
  EXPECT_EQ(Client(running.port()).request("POST", "/v2/models/cnn/infer", std::string(800, 'r')).status, 200);
}

TEST(HttpServer, RepliesFromOtherThreadsReachTheirConnections) {
  TestService service;
  RunningServer running(service, HttpOptions().io_threads(2));
  constexpr int kClients = 6;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>(running.port()));
    clients.back()->send_raw(Client::request_text("POST", "/v2/models/late/infer", "from " + std::to_string(i)));
  }
  service.wait_for_parked(kClients);
  std::thread replier([&] { service.release_parked(); });
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(clients[i]->read_response().body, "late:from " + std::to_string(i));
  }
  replier.join();
}

TEST(HttpServer, StopFinishesTheRequestInFlight) {
  TestService service;
  HttpServer server(service, HttpOptions().port(0));
  auto finished = std::async(std::launch::async, [&] { server.run(); });
  Client busy(server.port()), idle(server.port());
  EXPECT_EQ(idle.request("GET", "/v2/health/live").status, 200);
  busy.send_raw(Client::request_text("POST", "/v2/models/late/infer", "last words"));
  service.wait_for_parked(1);
  server.stop();
  EXPECT_TRUE(idle.closed_by_server());
  EXPECT_EQ(finished.wait_for(100ms), std::future_status::timeout);  // still owes a reply
  std::thread replier([&] { service.release_parked(); });
  Response response = busy.read_response();
  EXPECT_EQ(response.body, "late:last words");
  EXPECT_EQ(response.headers["connection"], "close");
  finished.get();
  replier.join();
  EXPECT_THROW(Client refused(server.port()), std::runtime_error);
}

TEST(HttpServer, StopBeforeRunMakesRunReturn) {
  TestService service;
  HttpServer server(service, HttpOptions().port(0).io_threads(2));
  server.stop();
  server.run();
}

TEST(HttpServer, BadListenOptionsNameTheField) {
  TestService service;
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().host("localhost:1")); }),
            "host: 'localhost:1' is not an IP address");
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().port(70000)); }),
            "port: 70000 is not a port number (0-65535)");
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().port(0).io_threads(0)); }),
            "io_threads: must be at least 1");
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().port(0).max_connections(0)); }),
            "max_connections: must be at least 1");
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().port(0).read_timeout(0ms)); }),
            "read_timeout: must be positive");
  EXPECT_EQ(error_message<UsageError>([&] { HttpServer(service, HttpOptions().port(0).idle_timeout(-1ms)); }),
            "idle_timeout: must be positive");
  HttpServer taken(service, HttpOptions().port(0));
  std::string message = error_message<Error>([&] { HttpServer(service, HttpOptions().port(taken.port())); });
  EXPECT_TRUE(Contains(message, "127.0.0.1:" + std::to_string(taken.port()) + ": cannot listen: "));
}

}  // namespace
}  // namespace afterburner::serve
