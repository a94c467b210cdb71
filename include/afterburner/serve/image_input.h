// Images in, class names out: a model whose config declares an image input (repository.h's
// ImageInput) takes JPEG or PNG bytes, POSTed as the body (Content-Type image/jpeg, image/png) or
// as the parts of a multipart/form-data body (a batch), and answers its output tensors as the v2
// protocol does plus the top classes of each image by name.
//
//   std::vector<std::string> images = multipart_parts(body, "multipart/form-data; boundary=x");
//   at::Tensor input = decode_request_images(config, std::move(images));   // float [N, C, S, S]
//   Reply reply = encode_image_response(config, run({input}), /*top_k=*/5);
//
// The answer: {"model_name", "outputs": [...], "classes": [[{"index", "name", "probability"}, ...]
// per image]}, probabilities the softmax of the first output's row (the model's logits), the most
// probable first (ties: the lower index first).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "afterburner/serve/repository.h"
#include "afterburner/serve/service.h"

namespace afterburner::serve {

// Whether a request body of this Content-Type is one encoded image (image/...).
bool is_image_content_type(std::string_view content_type);

// Whether it is multipart/form-data.
bool is_multipart_content_type(std::string_view content_type);

// The contents of the parts of a multipart/form-data body (RFC 7578), in order, whatever their
// names. Throws RequestError(400) for a missing boundary, a malformed or unterminated body, or no
// part.
std::vector<std::string> multipart_parts(std::string_view body, std::string_view content_type);

// The images decoded as config.image says, whole (no reduced-scale JPEG decoding: the same pixels
// as PIL's decoder): float32 [N, C, S, S]. Throws RequestError(400) naming the image ("image 2:
// corrupt JPEG ...") for one that is not a JPEG or PNG or does not decode.
at::Tensor decode_request_images(const ModelConfig& config, std::vector<std::string> images);

// The v2 response of `outputs` (all as JSON) with each image's top_k classes (at most all of
// them) of the first output, which must be [N, K].
Reply encode_image_response(const ModelConfig& config, const std::vector<at::Tensor>& outputs, int64_t top_k);

}  // namespace afterburner::serve
