#include "http_client.h"

#include <fmt/format.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cctype>
#include <chrono>
#include <stdexcept>

#include "afterburner/serve/protocol.h"

namespace afterburner::serve::testing {
namespace {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
}  // namespace

std::optional<std::size_t> HttpReply::json_length() const {
  auto found = headers.find("inference-header-content-length");
  if (found == headers.end()) return std::nullopt;
  return std::stoul(found->second);
}

struct HttpClient::Impl {
  net::io_context io;
  beast::tcp_stream stream{io};
  beast::flat_buffer buffer;

  template <typename Request>
  HttpReply exchange(Request& request) {
    request.set(http::field::host, "127.0.0.1");
    request.keep_alive(true);
    request.prepare_payload();
    stream.expires_after(std::chrono::seconds(60));
    http::write(stream, request);
    http::response_parser<http::string_body> parser;
    parser.body_limit(256u << 20);
    http::read(stream, buffer, parser);
    const auto& response = parser.get();
    HttpReply reply;
    reply.status = static_cast<int>(response.result_int());
    for (const auto& field : response) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      reply.headers[name] = std::string(field.value());
    }
    reply.body = response.body();
    return reply;
  }
};

HttpClient::HttpClient(int port) : impl_(std::make_unique<Impl>()) {
  impl_->stream.expires_after(std::chrono::seconds(60));
  impl_->stream.connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
}

HttpClient::~HttpClient() = default;

HttpReply HttpClient::get(const std::string& target) {
  http::request<http::empty_body> request(http::verb::get, target, 11);
  return impl_->exchange(request);
}

HttpReply HttpClient::post(const std::string& target, const std::string& body, std::optional<std::size_t> json_length) {
  http::request<http::string_body> request(http::verb::post, target, 11);
  request.set(http::field::content_type, json_length ? "application/octet-stream" : "application/json");
  if (json_length) request.set("Inference-Header-Content-Length", std::to_string(*json_length));
  request.body() = body;
  return impl_->exchange(request);
}

std::vector<std::pair<std::string, at::Tensor>> infer(HttpClient& client, const std::string& model,
                                                      const std::vector<std::pair<std::string, at::Tensor>>& inputs,
                                                      bool binary) {
  const auto request = encode_infer_request(inputs, RequestOptions().binary_inputs(binary).binary_outputs(binary));
  const auto reply = client.post(fmt::format("/v2/models/{}/infer", model), request.body, request.json_length);
  if (reply.status != 200) throw std::runtime_error(fmt::format("status {}: {}", reply.status, reply.body));
  return parse_infer_response(reply.body, reply.json_length());
}

}  // namespace afterburner::serve::testing
