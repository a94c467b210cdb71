// HTTP/1.1 front end of a Service: the Open Inference Protocol v2 REST routes and /metrics,
// served by a few Asio io threads (no thread per connection), keep-alive, TCP_NODELAY.
//
//   afterburner::serve::HttpServer server(service, afterburner::serve::HttpOptions().port(0));
//   std::cout << "listening on " << server.port() << "\n";   // the bound port: 0 picks one
//   std::thread io([&] { server.run(); });                    // blocks until stop()
//   server.stop();   // stop accepting; requests handed to the service still get their reply
//   io.join();
//
// Routes: GET /v2/health/live, /v2/health/ready, /v2, /v2/models/{name}[/versions/{v}][/ready],
// /metrics, /dashboard, /dashboard/data; POST /v2/models/{name}[/versions/{v}]/infer (binary
// extension: Inference-Header-Content-Length), /v2/repository/index,
// /v2/repository/models/{name}/load and /unload.
// Every error is a JSON body {"error": "..."}: 404 unknown path, 405 wrong method, 400 malformed
// request or bad Inference-Header-Content-Length, 413 body over max_body_bytes, 431 header over
// max_header_bytes, 408 request not received within read_timeout, 503 over max_connections or
// over max_pending_body_bytes.
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "afterburner/serve/service.h"

namespace afterburner::serve {

struct HttpOptions {
  // Loopback by default: listening on another interface is a deliberate choice.
  TORCH_ARG(std::string, host) = "127.0.0.1";
  // 0 binds an ephemeral port; HttpServer::port() tells which.
  TORCH_ARG(int, port) = 8000;
  // Threads running the sockets. Parsing is cheap next to a model: the other cores are the model's.
  TORCH_ARG(int, io_threads) = 1;
  TORCH_ARG(std::size_t, max_body_bytes) = 16u << 20;
  TORCH_ARG(std::size_t, max_header_bytes) = 16u << 10;
  // A request must arrive whole within this time once its first byte has; the response must be
  // taken by the client within it too. Bounds what slow and half-open clients can hold.
  TORCH_ARG(std::chrono::milliseconds, read_timeout) = std::chrono::seconds(10);
  // A keep-alive connection with no request for this long is closed.
  TORCH_ARG(std::chrono::milliseconds, idle_timeout) = std::chrono::seconds(60);
  // Connections beyond this are answered 503 and closed.
  TORCH_ARG(std::size_t, max_connections) = 1024;
  // Request body bytes all connections together may hold at once (being read or answered;
  // a body of unknown length counts as max_body_bytes). A request that would go over is
  // answered 503 before its body is read: memory stays bounded whatever the clients send.
  TORCH_ARG(std::size_t, max_pending_body_bytes) = 256u << 20;
};

class HttpServer {
 public:
  // Binds and listens at once (so port() is known before run()); throws afterburner::Error
  // naming host:port when it cannot.
  HttpServer(Service& service, HttpOptions options = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves on io_threads threads (this one included) until stop() and every in-flight
  // request has been answered.
  void run();
  // From any thread, any number of times, also before run(): closes the listener and idle
  // connections; requests already handed to the service are answered, then run() returns.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afterburner::serve
