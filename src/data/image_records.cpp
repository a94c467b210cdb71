#include "afterburner/data/image_records.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "afterburner/core/error.h"
#include "file_bytes.h"

namespace afterburner::data {
namespace {

torch::Tensor as_chw(const Pixels& pixels) {
  return torch::from_blob(const_cast<uint8_t*>(pixels.hwc.data()), {pixels.height, pixels.width, pixels.channels},
                          torch::kByte)
      .permute({2, 0, 1})
      .clone(at::MemoryFormat::Contiguous);
}

// torchvision's Resize(size) on a uint8 tensor (shorter side to `size`, the longer one scaled and
// truncated, bilinear with antialiasing, rounded) and CenterCrop(size).
torch::Tensor resized_and_cropped(const torch::Tensor& image, int64_t size) {
  const int64_t height = image.size(1), width = image.size(2);
  const bool portrait = height > width;
  const int64_t shorter = portrait ? width : height, longer = portrait ? height : width;
  const int64_t scaled = size * longer / shorter;
  const std::vector<int64_t> output = portrait ? std::vector<int64_t>{scaled, size} : std::vector<int64_t>{size, scaled};
  torch::Tensor resized = image;
  if (output[0] != height || output[1] != width) {
    resized = at::_upsample_bilinear2d_aa(image.unsqueeze(0).to(torch::kFloat), output, /*align_corners=*/false)
                  .squeeze(0)
                  .round_()
                  .clamp_(0, 255)
                  .to(torch::kByte);
  }
  // CenterCrop's offsets: int(round((side - size) / 2.0)), Python's round half to even.
  const auto offset = [size](int64_t side) { return static_cast<int64_t>(std::nearbyint((side - size) / 2.0)); };
  return resized.narrow(1, offset(output[0]), size).narrow(2, offset(output[1]), size);
}

// The records that decoded: their images, their labels, in record order.
struct Decoded {
  std::vector<torch::Tensor> images;
  std::vector<int64_t> labels;
  std::vector<std::string> sources;
};

Decoded decode_all(const ImageRecords& records, int64_t image_size, SkippedInputs* skipped) {
  const auto count = static_cast<size_t>(records.size());
  std::vector<torch::Tensor> images(count);
  std::vector<std::string> errors(count);  // recorded in record order, whichever thread met them
  at::parallel_for(0, records.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        torch::Tensor image = decode_record(records, i);
        images[i] = image_size > 0 ? resized_and_cropped(image, image_size) : image;
      } catch (const DataError& error) {
        if (skipped == nullptr) throw;
        errors[i] = error.what();
      }
    }
  });
  Decoded decoded;
  for (size_t i = 0; i < count; ++i) {
    if (!errors[i].empty()) {
      skipped->add(errors[i]);
      continue;
    }
    decoded.images.push_back(std::move(images[i]));
    decoded.labels.push_back(records.labels()[i]);
    decoded.sources.push_back(records.source(static_cast<int64_t>(i)));
  }
  return decoded;
}

}  // namespace

Batch ImageRecords::get_batch(const torch::Tensor& indices) const {
  check_indices(indices, size());
  const torch::Tensor all = torch::from_blob(const_cast<int64_t*>(labels().data()), {size()}, torch::kLong);
  return {indices.clone(), all.index_select(0, indices)};
}

ImageFiles::ImageFiles(ImageFileList files) : files_(std::move(files)) {
  if (files_.paths.size() != files_.labels.size()) {
    throw UsageError("ImageFiles", fmt::format("{} paths and {} labels", files_.paths.size(), files_.labels.size()));
  }
  const auto classes = static_cast<int64_t>(files_.classes.size());
  check_labels(torch::from_blob(files_.labels.data(), {size()}, torch::kLong), classes, "ImageFiles labels");
}

int64_t ImageFiles::size() const { return static_cast<int64_t>(files_.paths.size()); }

ImageRecords::Record ImageFiles::record(int64_t index, std::vector<char>& scratch) const {
  file_bytes(files_.paths.at(static_cast<size_t>(index)), scratch);
  return {reinterpret_cast<const uint8_t*>(scratch.data()), scratch.size()};
}

std::string ImageFiles::source(int64_t index) const { return files_.paths.at(static_cast<size_t>(index)); }

EncodedImages::EncodedImages(std::vector<std::string> images, std::string name)
    : images_(std::move(images)), name_(std::move(name)), labels_(images_.size(), 0) {}

ImageRecords::Record EncodedImages::record(int64_t index, std::vector<char>&) const {
  const std::string& image = images_.at(static_cast<size_t>(index));
  return {reinterpret_cast<const uint8_t*>(image.data()), image.size()};
}

std::string EncodedImages::source(int64_t index) const { return fmt::format("{} {}", name_, index + 1); }

ImageSize record_size(const ImageRecords::Record& record, const std::string& source) {
  if (record.raw) return {record.width, record.height, false};
  return read_image_size(record.bytes, record.size, source);
}

void record_pixels(const ImageRecords::Record& record, const std::string& source, int eighths, Pixels& into,
                   const Box* region) {
  if (!record.raw) return decode_pixels(record.bytes, record.size, source, eighths, into, region);
  into.width = record.width;
  into.height = record.height;
  into.channels = record.channels;
  into.left = into.top = 0;
  into.hwc.resize(record.size);
  std::memcpy(into.hwc.data(), record.bytes, record.size);
}

torch::Tensor decode_record(const ImageRecords& records, int64_t index) {
  thread_local std::vector<char> scratch;
  thread_local Pixels pixels;
  const std::string source = records.source(index);
  record_pixels(records.record(index, scratch), source, 8, pixels);
  return as_chw(pixels);
}

LabelledDataset decode_records(const ImageRecords& records, int64_t image_size, SkippedInputs* skipped,
                               const std::string& name) {
  Decoded decoded = decode_all(records, image_size, skipped);
  if (decoded.images.empty()) throw DataError(name, "none of its images could be read");
  const torch::Tensor& first = decoded.images.front();
  int64_t channels = 1;
  for (size_t i = 0; i < decoded.images.size(); ++i) {
    const torch::Tensor& image = decoded.images[i];
    if (image.size(1) != image.size(2)) {
      throw DataError(decoded.sources[i], fmt::format("{}x{} pixels, not square: give --image-size S to resize and "
                                                      "centre-crop the images to S x S",
                                                      image.size(2), image.size(1)));
    }
    if (image.size(1) != first.size(1)) {
      throw DataError(decoded.sources[i], fmt::format("{}x{} pixels, {} {}x{}: images of several sizes need "
                                                      "--image-size S to be resized to one",
                                                      image.size(2), image.size(1), decoded.sources.front(),
                                                      first.size(2), first.size(1)));
    }
    channels = std::max(channels, image.size(0));
  }
  const auto count = static_cast<int64_t>(decoded.images.size());
  torch::Tensor batch = torch::empty({count, channels, first.size(1), first.size(2)}, torch::kByte);
  at::parallel_for(0, count, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) batch[i].copy_(decoded.images[i].expand({channels, -1, -1}));
  });
  return {std::make_shared<TensorDataset>(batch, torch::tensor(decoded.labels, torch::kLong)), records.classes()};
}

}  // namespace afterburner::data
