#include "afterburner/data/image_pipeline.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "afterburner/core/error.h"
#include "file_bytes.h"
#include "random.h"

namespace afterburner::data {
namespace {

// Where output pixels read along one axis: output k sums inputs first[k] .. first[k] + count[k] - 1
// times weights[k * width ...]. PIL's and torchvision's antialiased bilinear resampling (the
// triangle filter, its support widened by the downscale factor, weights normalised to sum to 1).
struct Taps {
  std::vector<int64_t> first, count;
  std::vector<float> weights;
  int64_t width = 0;
};

// Taps over [start, start + length) of an axis of `limit` pixels, to `out` outputs. A box cropped
// and then resized reads only the pixels it covers, as torchvision's crop-then-resize does (a box
// of a reduced decode may start and end inside a pixel, which it then reads); a box cropped out of
// a resized image (`reads_outside`) reads its neighbours too, as the resize of the whole did.
Taps bilinear_taps(double start, double length, int64_t limit, int64_t out, bool reads_outside) {
  const double scale = length / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's radius, 1, times the downscale
  const auto first_pixel = reads_outside ? 0 : std::max<int64_t>(static_cast<int64_t>(std::floor(start)), 0);
  const auto end_pixel =
      reads_outside ? limit : std::min<int64_t>(static_cast<int64_t>(std::ceil(start + length)), limit);
  Taps taps;
  taps.width = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out);
  taps.count.resize(out);
  taps.weights.assign(static_cast<size_t>(out * taps.width), 0.f);
  std::vector<double> w(static_cast<size_t>(taps.width));
  for (int64_t k = 0; k < out; ++k) {
    const double center = start + (k + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(std::floor(center - support + 0.5)), first_pixel);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(std::floor(center + support + 0.5)), end_pixel);
    double total = 0;
    for (int64_t x = lo; x < hi; ++x) {
      w[x - lo] = std::max(0.0, 1.0 - std::abs((x - center + 0.5) / filter_scale));
      total += w[x - lo];
    }
    taps.first[k] = lo;
    taps.count[k] = hi - lo;
    for (int64_t t = 0; t < hi - lo; ++t) taps.weights[k * taps.width + t] = static_cast<float>(w[t] / total);
  }
  return taps;
}

// A box in (possibly fractional) pixels of a decoded image, and whether resampling it reads the
// pixels around it (bilinear_taps).
struct Region {
  double x, y, width, height;
  bool reads_outside = false;
};

// The two passes pick their instruction set at load time, as the kernels do (kernels/*.cpp): the
// build targets baseline x86-64.
#if defined(__x86_64__) && defined(__GNUC__)
#define AFTERBURNER_PIPELINE_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define AFTERBURNER_PIPELINE_CLONES
#endif

// target[i] += w * source[i]: one source row's share of an output row.
AFTERBURNER_PIPELINE_CLONES void accumulate_row(float* __restrict target, const uint8_t* __restrict source, float w,
                                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) target[i] += w * source[i];
}

// Where resampled pixels go: `count` channels of out x out values, value v of source channel
// min(o, C - 1) written to channel o as v * scale[o] + shift[o] (normalised; a gray image repeated),
// mirrored left-right when asked; as float32 or bfloat16, each channel a plane or interleaved
// (channels_last: channel o of pixel p at plane[0] + p * count + o).
struct Planes {
  void* plane[3];  // where channel o's first value goes
  int64_t count;
  float scale[3], shift[3];
  bool mirrored;
  bool bf16;
  bool interleaved;
};

// The across pass works on tiles of kTileRows output rows transposed so that the rows are the
// vector lanes: each output value is the same weighted sum of neighbouring columns in every row,
// so one broadcast weight times 16 rows is one vector FMA, where the interleaved rows took a
// scalar FMA per value (the pass was a fifth of a worker's time).
constexpr int64_t kTileRows = 16;

// The tile's rows of the columns pass's output, transposed: tile[j * kTileRows + lane] is value j
// of row y0 + lane (rows past the image read as zeros).
AFTERBURNER_PIPELINE_CLONES void transpose_in(const float* __restrict columns, int64_t span, int64_t rows,
                                              float* __restrict tile) {
  // Value by value, so that the tile is written a whole line at a time (its lines hold a value of
  // all 16 rows) and the 16 rows are read as 16 sequential streams.
  for (int64_t j = 0; j < span; ++j) {
    float* to = tile + j * kTileRows;
    for (int64_t lane = 0; lane < rows; ++lane) to[lane] = columns[lane * span + j];
    for (int64_t lane = rows; lane < kTileRows; ++lane) to[lane] = 0.f;
  }
}

// Output x of every lane, channel by channel, normalised: sums[(c * out + x) * kTileRows + lane].
template <int kChannels>
[[gnu::always_inline]] inline void across_tile(const float* __restrict tile, const Taps& across, int64_t left,
                                               int64_t out, float* __restrict sums) {
  for (int64_t x = 0; x < out; ++x) {
    float sum[kChannels][kTileRows] = {};
    const float* w = &across.weights[x * across.width];
    const float* pixel = tile + (across.first[x] - left) * kChannels * kTileRows;
    for (int64_t t = 0; t < across.count[x]; ++t) {
      for (int c = 0; c < kChannels; ++c) {
        for (int64_t lane = 0; lane < kTileRows; ++lane) {
          sum[c][lane] += w[t] * pixel[(t * kChannels + c) * kTileRows + lane];
        }
      }
    }
    for (int c = 0; c < kChannels; ++c) {
      for (int64_t lane = 0; lane < kTileRows; ++lane) sums[(c * out + x) * kTileRows + lane] = sum[c][lane];
    }
  }
}

// The tile's sums to output rows y0.. of the planes as T (float, or c10::BFloat16 rounding to
// nearest even), kStep elements apart along a row (1: planes; 3: channels_last RGB).
template <typename T, int kStep>
[[gnu::always_inline]] inline void write_rows(const float* __restrict sums, int64_t channels, const Planes& planes,
                                              int64_t y0, int64_t rows, int64_t out) {
  for (int64_t o = 0; o < planes.count; ++o) {
    const float* from = sums + std::min(o, channels - 1) * out * kTileRows;
    const float scale = planes.scale[o], shift = planes.shift[o];
    T* to = static_cast<T*>(planes.plane[o]) + y0 * out * kStep;
    for (int64_t lane = 0; lane < rows; ++lane) {
      T* __restrict row = to + lane * out * kStep;
      const float* __restrict sum = from + lane;
      if (planes.mirrored) {
        for (int64_t x = 0; x < out; ++x) row[(out - 1 - x) * kStep] = T(sum[x * kTileRows] * scale + shift);
      } else {
        for (int64_t x = 0; x < out; ++x) row[x * kStep] = T(sum[x * kTileRows] * scale + shift);
      }
    }
  }
}

// The tile's sums to output rows y0.. of the planes: value v of channel min(o, C - 1) as
// v * scale[o] + shift[o], mirrored when asked. One channel interleaved is a plane.
AFTERBURNER_PIPELINE_CLONES void transpose_out(const float* sums, int64_t channels, const Planes& planes, int64_t y0,
                                               int64_t rows, int64_t out) {
  const bool interleaved = planes.interleaved && planes.count == 3;
  if (planes.bf16) {
    interleaved ? write_rows<c10::BFloat16, 3>(sums, channels, planes, y0, rows, out)
                : write_rows<c10::BFloat16, 1>(sums, channels, planes, y0, rows, out);
  } else {
    interleaved ? write_rows<float, 3>(sums, channels, planes, y0, rows, out)
                : write_rows<float, 1>(sums, channels, planes, y0, rows, out);
  }
}

AFTERBURNER_PIPELINE_CLONES void across_tiles(const float* columns, int64_t span, const Taps& across, int64_t left,
                                              int64_t channels, const Planes& planes, int64_t out,
                                              std::vector<float>& scratch) {
  scratch.resize(static_cast<size_t>((span + channels * out) * kTileRows));
  float* tile = scratch.data();
  float* sums = tile + span * kTileRows;
  for (int64_t y0 = 0; y0 < out; y0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, out - y0);
    transpose_in(columns + y0 * span, span, rows, tile);
    if (channels == 3) {
      across_tile<3>(tile, across, left, out, sums);
    } else {
      across_tile<1>(tile, across, left, out, sums);
    }
    transpose_out(sums, channels, planes, y0, rows, out);
  }
}

// The region's pixels resampled to out x out into `planes`: down the columns first (into
// `columns`: each output row a weighted sum of whole source rows, runs that vectorize), then
// across, each value normalised and written to its place in one step.
void resample(const Pixels& image, const Region& region, int64_t out, std::vector<float>& columns,
              std::vector<float>& tiles, const Planes& planes) {
  const Taps across = bilinear_taps(region.x, region.width, image.width, out, region.reads_outside);
  const Taps down = bilinear_taps(region.y, region.height, image.height, out, region.reads_outside);
  const int64_t channels = image.channels, row_stride = image.width * channels;
  const int64_t left = across.first.front(), span = (across.first.back() + across.count.back() - left) * channels;
  columns.assign(static_cast<size_t>(out * span), 0.f);
  for (int64_t k = 0; k < out; ++k) {
    for (int64_t t = 0; t < down.count[k]; ++t) {
      accumulate_row(columns.data() + k * span, image.hwc.data() + (down.first[k] + t) * row_stride + left * channels,
                     down.weights[k * down.width + t], span);
    }
  }
  across_tiles(columns.data(), span, across, left, channels, planes, out, tiles);
}

// RandomResizedCrop's box (torchvision's get_params): up to 10 draws of an area share and a
// log-uniform aspect ratio that fit, else the centre at the ratio's nearest bound.
Box random_box(int64_t width, int64_t height, const DecodeOptions& o, uint64_t seed) {
  const double area = static_cast<double>(width) * height;
  const double log_min = std::log(o.min_ratio()), log_max = std::log(o.max_ratio());
  for (uint64_t attempt = 0; attempt < 10; ++attempt) {
    const double share = o.min_area() + (o.max_area() - o.min_area()) * unit_interval(derive_seed(seed, 4 * attempt));
    const double ratio = std::exp(log_min + (log_max - log_min) * unit_interval(derive_seed(seed, 4 * attempt + 1)));
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(area * share * ratio)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(area * share / ratio)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const auto x = static_cast<int64_t>(bounded(derive_seed(seed, 4 * attempt + 2), width - w + 1));
      const auto y = static_cast<int64_t>(bounded(derive_seed(seed, 4 * attempt + 3), height - h + 1));
      return {x, y, w, h};
    }
  }
  const double ratio = static_cast<double>(width) / height;
  int64_t w = width, h = height;
  if (ratio < o.min_ratio()) h = static_cast<int64_t>(std::nearbyint(w / o.min_ratio()));
  if (ratio > o.max_ratio()) w = static_cast<int64_t>(std::nearbyint(h * o.max_ratio()));
  return {(width - w) / 2, (height - h) / 2, w, h};
}

// The centred offset of `length` in `total`, as torchvision's CenterCrop rounds it (half to even).
int64_t centred(int64_t total, int64_t length) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(total - length) / 2));
}

// An offset of `length` in `total` drawn uniformly (RandomCrop's).
int64_t anywhere(int64_t total, int64_t length, uint64_t seed) {
  return static_cast<int64_t>(bounded(seed, static_cast<uint64_t>(total - length + 1)));
}

// The size x size window of the stored pixels the crop keeps (no resize): throws DataError naming
// `path` for an image smaller than it.
Region stored_window(int64_t width, int64_t height, const DecodeOptions& o, uint64_t seed, const std::string& path) {
  const int64_t size = o.size();
  if (std::min(width, height) < size) {
    throw DataError(path, fmt::format("{}x{} is smaller than the {}-pixel crop (resize it first, as --transforms "
                                      "resize{},crop{})",
                                      width, height, size, size, size));
  }
  const bool centre = o.crop() == Crop::centre;
  return {double(centre ? centred(width, size) : anywhere(width, size, derive_seed(seed, 0))),
          double(centre ? centred(height, size) : anywhere(height, size, derive_seed(seed, 1))), double(size),
          double(size)};
}

// Where the size x size crop of the image resized by torchvision's Resize(resize) (the shorter
// side to `resize`, the longer to int(resize * longer / shorter)) lies in the stored pixels: a
// fractional box that reads its neighbours, so that resampling it equals resizing the whole image
// and cropping whole pixels of the result.
Region resized_window(int64_t width, int64_t height, const DecodeOptions& o, uint64_t seed) {
  const int64_t shorter = std::min(width, height), longer = std::max(width, height);
  const auto resized_longer = static_cast<int64_t>(static_cast<double>(o.resize()) * longer / shorter);
  const int64_t resized_width = width <= height ? o.resize() : resized_longer;
  const int64_t resized_height = width <= height ? resized_longer : o.resize();
  const bool centre = o.crop() == Crop::centre;
  const int64_t left = centre ? centred(resized_width, o.size()) : anywhere(resized_width, o.size(), derive_seed(seed, 0));
  const int64_t top = centre ? centred(resized_height, o.size()) : anywhere(resized_height, o.size(), derive_seed(seed, 1));
  const double sx = static_cast<double>(width) / resized_width, sy = static_cast<double>(height) / resized_height;
  return {left * sx, top * sy, o.size() * sx, o.size() * sy, true};
}

// The region of the stored image that the options' crop resamples: RandomResizedCrop's box, or
// the window of RandomCrop or CenterCrop, of the image resized first or not.
Region crop_region(int64_t width, int64_t height, const DecodeOptions& o, uint64_t seed, const std::string& path) {
  if (o.crop() == Crop::random_resized) {
    const Box box = random_box(width, height, o, seed);
    return {double(box.x), double(box.y), double(box.width), double(box.height)};
  }
  return o.resize() == 0 ? stored_window(width, height, o, seed, path) : resized_window(width, height, o, seed);
}

// The smallest DCT scale at which the box still spans `size` pixels each way (8/8: whole). Of
// libjpeg-turbo's n/8 scales only 1/8, 1/4 and 1/2 have SIMD kernels: the others decode slower
// than the whole image (measured), so they are not taken.
int decode_eighths(const Region& box, int64_t size) {
  for (int eighths : {1, 2, 4}) {
    if (box.width * eighths >= size * 8 && box.height * eighths >= size * 8) return eighths;
  }
  return 8;
}

// RGB pixels made gray in place as PIL's convert("L") does (ITU-R 601-2 luma in 16-bit fixed
// point, rounded).
void to_luma(Pixels& pixels) {
  const int64_t count = pixels.width * pixels.height;
  uint8_t* values = pixels.hwc.data();
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* rgb = values + 3 * i;
    values[i] = static_cast<uint8_t>((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
  }
  pixels.channels = 1;
  pixels.hwc.resize(static_cast<size_t>(count));
}

// A worker's buffers, kept from image to image: allocating them anew per image cost page faults
// (glibc maps blocks this large afresh each time).
struct Scratch {
  std::vector<char> file;
  Pixels pixels;
  std::vector<float> columns, tiles;
};

// The image's size decoded at eighths/8 (libjpeg rounds the scaled size up).
ImageSize scaled_size(const ImageSize& stored, int eighths) {
  return {(stored.width * eighths + 7) / 8, (stored.height * eighths + 7) / 8, stored.partial_decoding};
}

// Where `box` of the stored image lies in the image decoded at `scaled` size.
Region scaled_region(const Region& box, const ImageSize& stored, const ImageSize& scaled) {
  const double sx = static_cast<double>(scaled.width) / stored.width;
  const double sy = static_cast<double>(scaled.height) / stored.height;
  return {box.x * sx, box.y * sy, box.width * sx, box.height * sy, box.reads_outside};
}

// The pixels to decode for resampling a region of an image of `size` to `out` pixels: those it
// touches, when it reads outside the filter's reach beyond, and 2 more each way, so that the
// region's edge pixels get their colour from both neighbouring chroma samples (a decode that starts
// at the region would repeat the edge's: 4:2:0 JPEGs then differed from the whole decode by up to
// 11 levels at the edges). Rounding cannot take it outside the image.
Box covering_box(const Region& region, const ImageSize& size, int64_t out) {
  constexpr double kChromaNeighbours = 2;
  const double reach =
      kChromaNeighbours +
      (region.reads_outside ? std::ceil(std::max({region.width / out, region.height / out, 1.0})) + 1 : 0);
  const auto x = std::max<int64_t>(static_cast<int64_t>(std::floor(region.x - reach)), 0);
  const auto y = std::max<int64_t>(static_cast<int64_t>(std::floor(region.y - reach)), 0);
  const auto right =
      std::min<int64_t>(static_cast<int64_t>(std::ceil(region.x + region.width + reach)), size.width);
  const auto bottom =
      std::min<int64_t>(static_cast<int64_t>(std::ceil(region.y + region.height + reach)), size.height);
  return {x, y, right - x, bottom - y};
}

class DecodeImages : public BatchTransform {
 public:
  DecodeImages(std::shared_ptr<const ImageRecords> records, DecodeOptions options)
      : records_(std::move(records)), options_(std::move(options)) {
    const int64_t channels = options_.channels();
    if (channels != 1 && channels != 3) {
      throw UsageError("decode_images channels", fmt::format("{} is not 1 or 3", channels));
    }
    if (options_.size() < 1) throw UsageError("decode_images size", "must be at least 1");
    if (options_.resize() != 0 && options_.resize() < options_.size()) {
      throw UsageError("decode_images resize", fmt::format("{} is smaller than the {}-pixel crop", options_.resize(),
                                                           options_.size()));
    }
    if (options_.dtype() != torch::kFloat && options_.dtype() != torch::kBFloat16) {
      throw UsageError("decode_images dtype", fmt::format("{} is not float32 or bfloat16", c10::toString(options_.dtype())));
    }
    const std::vector<double>& mean = options_.mean();
    const std::vector<double>& std = options_.std();
    if (mean.size() != std.size() || !(mean.empty() || mean.size() == 1 || int64_t(mean.size()) == channels)) {
      throw UsageError("decode_images mean",
                       fmt::format("{} means and {} stds for {} channels", mean.size(), std.size(), channels));
    }
    for (int64_t c = 0; c < channels; ++c) {  // v in 0..255 -> (v / 255 - mean) / std
      const double m = mean.empty() ? 0 : mean[mean.size() == 1 ? 0 : c];
      const double s = std.empty() ? 1 : std[std.size() == 1 ? 0 : c];
      if (!(s > 0)) throw UsageError("decode_images std", fmt::format("{} is not positive", s));
      scale_.push_back(static_cast<float>(1.0 / (255.0 * s)));
      shift_.push_back(static_cast<float>(-m / s));
    }
  }

  Batch operator()(Batch batch, uint64_t seed) const override {
    const torch::Tensor indices = batch.input.contiguous();
    const int64_t n = indices.numel(), size = options_.size(), channels = options_.channels();
    torch::Tensor images = batch_buffer({n, channels, size, size});
    auto* first = static_cast<char*>(images.data_ptr());
    const int64_t image_bytes = channels * size * size * images.element_size();
    for (int64_t i = 0; i < n; ++i) {
      decode_one(indices.data_ptr<int64_t>()[i], derive_seed(seed, static_cast<uint64_t>(i)), first + i * image_bytes);
    }
    return {images, std::move(batch.target)};
  }

  std::string describe() const override {
    const char* crops[] = {"random_resized_crop", "random_crop", "centre_crop"};
    return fmt::format("decode_images(size={}, {}, resize={}, flip={}, reduced_decode={}, {}{})", options_.size(),
                       crops[static_cast<int>(options_.crop())], options_.resize(), options_.flip(),
                       options_.reduced_decode(), c10::toString(options_.dtype()), options_.channels_last() ? ", channels_last" : "");
  }

 private:
  // Sample `index` decoded, cropped, resampled, mirrored and normalised into `out`, its
  // [C, size, size] values in the batch's type and layout.
  void decode_one(int64_t index, uint64_t seed, char* out) const {
    const std::string path = records_->source(index);
    thread_local Scratch scratch;
    const ImageRecords::Record record = records_->record(index, scratch.file);
    const ImageSize stored = record_size(record, path);
    const int64_t size = options_.size();
    const Region box = crop_region(stored.width, stored.height, options_, seed, path);
    const bool reduced = options_.reduced_decode() && stored.partial_decoding;
    const int eighths = reduced ? decode_eighths(box, size) : 8;
    const ImageSize scaled = scaled_size(stored, eighths);
    const Region region = scaled_region(box, stored, scaled);
    const Box part = covering_box(region, scaled, size);
    const Pixels& pixels = scratch.pixels;
    record_pixels(record, path, eighths, scratch.pixels, reduced ? &part : nullptr);
    if (pixels.channels > options_.channels()) {
      if (!options_.gray_from_colour()) {
        throw DataError(path, "a colour image in a set decoded to one channel (DecodeOptions::channels)");
      }
      to_luma(scratch.pixels);
    }
    const Region within{region.x - pixels.left, region.y - pixels.top, region.width, region.height,
                        region.reads_outside};
    const bool bf16 = options_.dtype() == torch::kBFloat16, interleaved = options_.channels_last();
    Planes planes{{}, options_.channels(), {}, {}, unit_interval(derive_seed(seed, 1000)) < options_.flip(), bf16,
                  interleaved};
    const int64_t element = bf16 ? 2 : 4, channel_offset = interleaved ? 1 : size * size;
    for (int64_t c = 0; c < planes.count; ++c) {
      planes.plane[c] = out + c * channel_offset * element;
      planes.scale[c] = scale_[c];
      planes.shift[c] = shift_[c];
    }
    resample(pixels, within, size, scratch.columns, scratch.tiles, planes);
  }

  // A tensor of `sizes` (of the options' type and layout) for a batch: one whose last batch nobody
  // holds any more (no tensor
  // nor view of it outside this pool), else a new one, kept for later batches. A batch of 64
  // images at 224 px is 38 MB, which glibc maps afresh and the kernel zero-fills page by page
  // for each batch: a fifth of a worker's time before the pool.
  torch::Tensor batch_buffer(c10::IntArrayRef sizes) const {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    for (const torch::Tensor& buffer : pool_) {
      if (buffer.sizes() == sizes && buffer.use_count() == 1 && buffer.storage().use_count() == 1) return buffer;
    }
    torch::Tensor buffer =
        torch::empty(sizes, torch::TensorOptions(options_.dtype()),
                     options_.channels_last() ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
    if (pool_.size() < kPoolSize) pool_.push_back(buffer);
    return buffer;
  }

  // Batches in flight at once: prefetched by every worker, held by the caller, one being built.
  static constexpr size_t kPoolSize = 24;

  std::shared_ptr<const ImageRecords> records_;
  DecodeOptions options_;
  std::vector<float> scale_, shift_;
  mutable std::mutex pool_mutex_;
  mutable std::vector<torch::Tensor> pool_;
};

}  // namespace

torch::Tensor resample_box(const Pixels& pixels, const Box& box, int64_t size) {
  if (box.x < 0 || box.y < 0 || box.width < 1 || box.height < 1 || box.x + box.width > pixels.width ||
      box.y + box.height > pixels.height) {
    throw UsageError("box", fmt::format("({}, {}) {}x{} is not inside the {}x{} image", box.x, box.y, box.width,
                                        box.height, pixels.width, pixels.height));
  }
  torch::Tensor planes = torch::empty({pixels.channels, size, size}, torch::kFloat);
  Planes into{{}, pixels.channels, {}, {}, false, false, false};
  for (int64_t c = 0; c < pixels.channels; ++c) {
    into.plane[c] = planes[c].data_ptr<float>();
    into.scale[c] = 1;
    into.shift[c] = 0;
  }
  std::vector<float> columns, tiles;
  resample(pixels, Region{double(box.x), double(box.y), double(box.width), double(box.height)}, size, columns, tiles,
           into);
  return planes;
}

ImageFileList readable_images(const ImageFileList& list, SkippedInputs& skipped, int64_t min_side) {
  constexpr int kSmallestScale = 1;  // eighths
  std::vector<std::string> errors(list.paths.size());
  at::parallel_for(0, static_cast<int64_t>(errors.size()), 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      try {
        file_bytes(list.paths[i], scratch.file);
        const auto* bytes = reinterpret_cast<const uint8_t*>(scratch.file.data());
        decode_pixels(bytes, scratch.file.size(), list.paths[i], kSmallestScale, scratch.pixels);
        const ImageSize stored = read_image_size(bytes, scratch.file.size(), list.paths[i]);
        if (std::min(stored.width, stored.height) < min_side) {
          throw DataError(list.paths[i], fmt::format("{}x{} is smaller than the {}-pixel crop", stored.width,
                                                     stored.height, min_side));
        }
      } catch (const DataError& error) {
        errors[i] = error.what();
      }
    }
  });
  ImageFileList readable{{}, {}, list.classes};
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].empty()) {
      skipped.add(errors[i]);
      continue;
    }
    readable.paths.push_back(list.paths[i]);
    readable.labels.push_back(list.labels[i]);
  }
  if (readable.paths.empty()) throw DataError(list.paths.front(), "none of the images could be read");
  return readable;
}

TransformPtr decode_images(std::shared_ptr<const ImageRecords> records, DecodeOptions options) {
  return std::make_shared<DecodeImages>(std::move(records), std::move(options));
}

}  // namespace afterburner::data
