// A blocking HTTP/1.1 client on one keep-alive connection (Boost.Beast), for the tests that talk
// to a real server on loopback: the differential corpus and the served-cnn acceptance test.
//
//   HttpClient client(server_port);
//   auto reply = client.post("/v2/models/cnn/infer", body, json_length);   // binary extension
//   if (reply.status == 200) use(parse_infer_response(reply.body, reply.json_length()));
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace afterburner::serve::testing {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  // The Inference-Header-Content-Length header, when the reply carries binary tensors.
  std::optional<std::size_t> json_length() const;
};

class HttpClient {
 public:
  // Connects to 127.0.0.1:port; every read and write fails after 60 s instead of hanging.
  explicit HttpClient(int port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  HttpReply get(const std::string& target);
  // With json_length: the Inference-Header-Content-Length header (binary tensor extension).
  HttpReply post(const std::string& target, const std::string& body, std::optional<std::size_t> json_length = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// POST /v2/models/{model}/infer of `inputs` (JSON, or binary both ways); returns the outputs in
// the order the reply lists them. Throws std::runtime_error with the status and body of a reply
// that is not 200.
std::vector<std::pair<std::string, at::Tensor>> infer(HttpClient& client, const std::string& model,
                                                      const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                                                      bool binary);

}  // namespace afterburner::serve::testing
