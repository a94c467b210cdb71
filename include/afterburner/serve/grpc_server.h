// gRPC front end of a Service: KServe's v2 `inference.GRPCInferenceService` (proto/inference.proto)
// beside the HTTP server, sharing its models and batchers. Triton's and KServe's gRPC clients
// work with it unchanged.
//
//   afterburner::serve::GrpcServer grpc(service, afterburner::serve::GrpcOptions().port(0));
//   std::cout << "gRPC on " << grpc.port() << "\n";  // serving from here on, on gRPC's threads
//   grpc.stop();  // refuses new calls, waits for those in flight
//
// RPCs: ServerLive, ServerReady, ServerMetadata, ModelReady, ModelMetadata, ModelInfer. ModelInfer
// takes inputs as raw_input_contents (or typed contents: fp32_contents, int64_contents, ...)
// and answers raw_output_contents, the same bytes as the HTTP binary extension's. Errors are
// the call's status with a one-line message: INVALID_ARGUMENT (400), NOT_FOUND (404: no such
// model or version), UNAVAILABLE (503: queue full), DEADLINE_EXCEEDED (504), UNIMPLEMENTED (501),
// INTERNAL (500).
#pragma once

#include <torch/arg.h>

#include <cstddef>
#include <memory>
#include <string>

#include "afterburner/serve/service.h"

namespace afterburner::serve {

struct GrpcOptions {
  // Loopback by default, as HTTP: listening on another interface is a deliberate choice.
  TORCH_ARG(std::string, host) = "127.0.0.1";
  // 0 binds an ephemeral port; GrpcServer::port() tells which.
  TORCH_ARG(int, port) = 8001;
  // Largest request message accepted (RESOURCE_EXHAUSTED beyond), as HTTP's max_body_bytes.
  TORCH_ARG(std::size_t, max_message_bytes) = 16u << 20;
};

class GrpcServer {
 public:
  // Binds and starts serving; throws afterburner::Error naming host:port when it cannot.
  GrpcServer(Service& service, GrpcOptions options = {});
  ~GrpcServer();  // stop()
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const;
  // From any thread, any number of times: new calls are refused, those in flight answered.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace afterburner::serve
