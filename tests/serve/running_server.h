// An HttpServer on an ephemeral loopback port, run on its own thread for the life of the object:
// the in-process server of the HTTP and load-generator tests.
//
//   RunningServer running(service);
//   connect_to(running.port());
#pragma once

#include <thread>

#include "afterburner/serve/http_server.h"

namespace afterburner::serve::testing {

class RunningServer {
 public:
  explicit RunningServer(Service& service, HttpOptions options = {})
      : server_(service, options.port(0)), thread_([this] { server_.run(); }) {}
  ~RunningServer() {
    server_.stop();
    thread_.join();
  }
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  HttpServer& server() { return server_; }
  int port() const { return server_.port(); }

 private:
  HttpServer server_;
  std::thread thread_;
};

}  // namespace afterburner::serve::testing
