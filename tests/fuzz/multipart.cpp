// Images POSTed to a served model (serve/image_input.h): a multipart/form-data body split into
// its parts, and each part decoded as an image input takes it (gray, resized, centre-cropped).
// The input's first line is the Content-Type's boundary, the rest the body.
#include <torch/torch.h>

#include <algorithm>

#include "afterburner/serve/image_input.h"
#include "fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input = afterburner::fuzz::bytes(data, size);
  const size_t line = std::min(input.find('\n'), input.size());
  afterburner::serve::ModelConfig config;
  config.name = "fuzz";
  config.inputs = {{"input", afterburner::serve::DataType::FP32, {1, 8, 8}}};
  config.image = afterburner::serve::ImageInput{"resize9,centre8", {0.5}, {0.25}, {}};
  afterburner::fuzz::expect_clean_errors([&] {
    const std::string content_type = "multipart/form-data; boundary=" + input.substr(0, line);
    const std::string body = input.substr(std::min(line + 1, input.size()));
    std::vector<std::string> parts = afterburner::serve::multipart_parts(body, content_type);
    constexpr size_t kPartsDecoded = 4;
    parts.resize(std::min(parts.size(), kPartsDecoded));
    const at::Tensor images = afterburner::serve::decode_request_images(config, std::move(parts));
    if (!torch::isfinite(images).all().item<bool>()) afterburner::fuzz::finding("non-finite pixels");
  });
  return 0;
}
