// The HTTP server (serve/http_server.h): the input is what one client sends on one loopback
// connection (one or more requests, pipelined, possibly cut short); the client then closes its
// side and reads until the server closes. Beast parses the request head; this fuzzes what the
// server does around it: limits, 100-continue, routing, methods, Inference-Header-Content-Length,
// keep-alive and pipelining, error answers. A connection the server does not close is a finding.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <thread>

#include "afterburner/serve/http_server.h"
#include "afterburner/serve/protocol.h"
#include "fuzz.h"

namespace {

using namespace afterburner::serve;
using namespace std::chrono_literals;

// Answers infer by parsing the body as a real model's service does, without running a model.
class ParsingService : public Service {
 public:
  ParsingService() {
    config_.name = "cnn";
    config_.max_batch_size = 4;
    config_.inputs = {{"input", DataType::FP32, {2}}};
    config_.outputs = {{"output", DataType::FP32, {2}}};
  }
  bool live() const override { return true; }
  bool ready() const override { return true; }
  Reply server_metadata() const override { return Reply{200, "application/json", R"({"name":"fuzz"})", {}}; }
  Reply model_metadata(ModelRef model) const override { return model_ready(model); }
  Reply model_ready(ModelRef model) const override {
    if (model.name != config_.name) return error_reply(404, "no model");
    return Reply{200, "application/json", R"({"ready":true})", {}};
  }
  void infer(ModelRef model, std::string body, std::optional<std::size_t> json_length, ReplyCallback reply) override {
    if (model.name != config_.name) return reply(error_reply(404, "no model"));
    try {
      InferRequest request = parse_infer_request(body, json_length, config_);
      reply(encode_infer_response(config_, request, request.inputs));
    } catch (const RequestError& e) {
      reply(error_reply(e.status(), e.what()));
    }
  }
  std::string metrics() const override { return "fuzz_requests_total 1\n"; }

 private:
  ModelConfig config_;
};

// Started once and never stopped: the process ends with the fuzzing run.
int server_port() {
  static ParsingService* service = new ParsingService;
  static HttpServer* server = new HttpServer(*service, HttpOptions()
                                                          .port(0)
                                                          .max_body_bytes(1 << 16)
                                                          .max_header_bytes(1 << 12)
                                                          .read_timeout(2s)
                                                          .idle_timeout(2s));
  static std::thread* io = new std::thread([] { server->run(); });
  (void)io;
  return server->port();
}

[[noreturn]] void fail(const char* call) {
  std::perror(call);  // the harness's own trouble, not a finding
  std::abort();
}

// Waits for the connection connect() went on making: a connection that never completes is a
// hang, which libFuzzer's -timeout reports as a finding.
bool connected_after_interrupt(int fd) {
  pollfd ready{fd, POLLOUT, 0};
  int polled;
  while ((polled = poll(&ready, 1, /*timeout=*/-1)) < 0 && errno == EINTR) {
  }
  int error = 0;
  socklen_t length = sizeof error;
  return polled == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
}

// From a new loopback source address each time (127.1.0.0/16, in turn): the client closes first,
// so each connection's port stays in TIME_WAIT for a minute, and at hundreds of inputs a second
// one source address would run out of ports.
int connect_to(int port) {
  static uint32_t connections = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) fail("socket");
  timeval timeout{5, 0};  // over read_timeout: a server that keeps the connection is a finding
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl(0x7F010000u | (connections++ & 0xFFFFu));
  if (bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source) != 0) fail("bind");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    // EINTR (libFuzzer's timer): connect cannot be restarted, the connection goes on being made.
    if (errno != EINTR || !connected_after_interrupt(fd)) fail("connect");
  }
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int port = server_port();
  int fd = connect_to(port);
  // EINTR: libFuzzer's timer that watches for slow inputs is a signal.
  for (std::size_t sent = 0; sent < size;) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server may answer and close early (413, 431)
    sent += static_cast<std::size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  char chunk[4096];
  ssize_t n;
  while ((n = recv(fd, chunk, sizeof chunk, 0)) > 0 || (n < 0 && errno == EINTR)) {
  }
  if (n < 0 && errno != ECONNRESET) {
    afterburner::fuzz::finding("the server kept the connection open after the client closed");
  }
  close(fd);
  return 0;
}
