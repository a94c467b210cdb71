#include "afterburner/serve/image_input.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <numeric>

#include "afterburner/core/error.h"
#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/image_records.h"
#include "afterburner/data/image_transforms.h"
#include "afterburner/serve/protocol.h"

namespace afterburner::serve {
namespace {

std::string lower(std::string_view text) {
  std::string lowered(text);
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  return lowered;
}

// The media type of a Content-Type, lower case, without its parameters.
std::string media_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  return lower(type);
}

// A Content-Type's boundary parameter, unquoted ("" when it has none).
std::string boundary_of(std::string_view content_type) {
  const std::string lowered = lower(content_type);
  const size_t found = lowered.find("boundary=");
  if (found == std::string::npos) return "";
  std::string_view value = content_type.substr(found + 9);
  value = value.substr(0, value.find(';'));
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
  return std::string(value);
}

[[noreturn]] void bad_multipart(const std::string& problem) {
  throw RequestError(400, "multipart/form-data body: " + problem);
}

// The softmax of one row of logits, in double precision.
std::vector<double> probabilities(const at::Tensor& logits) {
  const at::Tensor row = logits.to(torch::kDouble).contiguous();
  const double* values = row.data_ptr<double>();
  const int64_t count = row.numel();
  const double largest = *std::max_element(values, values + count);
  std::vector<double> shares(static_cast<size_t>(count));
  double total = 0;
  for (int64_t k = 0; k < count; ++k) total += shares[k] = std::exp(values[k] - largest);
  for (double& share : shares) share /= total;
  return shares;
}

}  // namespace

bool is_image_content_type(std::string_view content_type) { return media_type(content_type).rfind("image/", 0) == 0; }

bool is_multipart_content_type(std::string_view content_type) {
  return media_type(content_type) == "multipart/form-data";
}

std::vector<std::string> multipart_parts(std::string_view body, std::string_view content_type) {
  const std::string boundary = boundary_of(content_type);
  if (boundary.empty()) bad_multipart("the Content-Type names no boundary");
  const std::string delimiter = "--" + boundary;
  size_t at = body.find(delimiter);
  if (at == std::string_view::npos) bad_multipart("no part starts with --" + boundary);
  std::vector<std::string> parts;
  while (true) {
    at += delimiter.size();
    if (body.substr(at, 2) == "--") break;  // the closing delimiter
    if (body.substr(at, 2) != "\r\n") bad_multipart("a delimiter is not followed by CRLF");
    const size_t headers_end = body.find("\r\n\r\n", at);
    if (headers_end == std::string_view::npos) bad_multipart(fmt::format("part {} has no end of headers", parts.size() + 1));
    const size_t content = headers_end + 4;
    const size_t next = body.find("\r\n" + delimiter, content);
    if (next == std::string_view::npos) bad_multipart(fmt::format("part {} is not terminated", parts.size() + 1));
    parts.emplace_back(body.substr(content, next - content));
    at = next + 2;
  }
  if (parts.empty()) bad_multipart("no part");
  return parts;
}

at::Tensor decode_request_images(const ModelConfig& config, std::vector<std::string> images) {
  const ImageInput& image = config.image.value();
  const TensorSpec& spec = config.inputs.front();
  const auto count = static_cast<int64_t>(images.size());
  const auto records = std::make_shared<data::EncodedImages>(std::move(images), "image");
  const data::DecodeOptions options = data::parse_image_transforms(image.transforms)
                                          .decode_options(false, spec.dims[1])
                                          .channels(spec.dims[0])
                                          .gray_from_colour(true)
                                          .mean(image.mean)
                                          .std(image.std)
                                          .reduced_decode(false);
  try {
    return (*data::decode_images(records, options))(records->get_batch(torch::arange(count)), 0).input;
  } catch (const DataError& e) {
    throw RequestError(400, e.what());
  }
}

Reply encode_image_response(const ModelConfig& config, const std::vector<at::Tensor>& outputs, int64_t top_k) {
  InferRequest all;
  for (const auto& spec : config.outputs) all.outputs.push_back({spec.name, false});
  Reply reply = encode_infer_response(config, all, outputs);
  const at::Tensor& scores = outputs.front();
  if (reply.status != 200) return reply;
  if (scores.dim() != 2) {
    return error_reply(500, fmt::format("model '{}': output '{}' is [{}], not [images, classes]", config.name,
                                        config.outputs.front().name, fmt::join(scores.sizes(), ", ")));
  }
  const std::vector<std::string>& names = config.image->classes;
  nlohmann::json classes = nlohmann::json::array();
  for (int64_t i = 0; i < scores.size(0); ++i) {
    const std::vector<double> shares = probabilities(scores[i]);
    std::vector<int64_t> order(shares.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return shares[a] > shares[b]; });
    nlohmann::json best = nlohmann::json::array();
    for (int64_t k = 0; k < std::min<int64_t>(top_k, static_cast<int64_t>(order.size())); ++k) {
      const int64_t index = order[k];
      best.push_back({{"index", index},
                      {"name", index < static_cast<int64_t>(names.size()) ? names[index] : std::to_string(index)},
                      {"probability", shares[index]}});
    }
    classes.push_back(std::move(best));
  }
  reply.body.pop_back();  // the closing brace of the v2 response
  reply.body += ",\"classes\":" + classes.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "}";
  return reply;
}

}  // namespace afterburner::serve
