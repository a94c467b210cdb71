#include "afterburner/data/transforms.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "afterburner/core/error.h"
#include "random.h"

namespace afterburner::data {
namespace {

void check_image_batch(const char* transform, const torch::Tensor& input) {
  if (input.dim() != 4) {
    throw UsageError(transform, fmt::format("expects [N, C, H, W] input, got {}", c10::str(input.sizes())));
  }
}

// Where each output sample reads from: source row y + shift_y, source column x + shift_x,
// or (W - 1 - x) + shift_x when mirrored.
struct SampleGeometry {
  explicit SampleGeometry(int64_t n) : shift_y(n, 0), shift_x(n, 0), mirror(n, 0) {}
  std::vector<int64_t> shift_y, shift_x;
  std::vector<uint8_t> mirror;
};

// Crop offsets uniform in [0, 2 * padding], i.e. shifts in [-padding, padding].
void draw_crop(SampleGeometry& geometry, int64_t padding, uint64_t seed) {
  const auto choices = static_cast<uint64_t>(2 * padding + 1);
  for (size_t i = 0; i < geometry.shift_y.size(); ++i) {
    geometry.shift_y[i] = static_cast<int64_t>(bounded(derive_seed(seed, 2 * i), choices)) - padding;
    geometry.shift_x[i] = static_cast<int64_t>(bounded(derive_seed(seed, 2 * i + 1), choices)) - padding;
  }
}

// Mirroring after the crop reads column (W - 1 - x) + shift; mirroring first reads the mirrored
// padded image at x + shift, which is column (W - 1 - x) - shift of the source.
void draw_mirror(SampleGeometry& geometry, double p, uint64_t seed, bool before_crop) {
  for (size_t i = 0; i < geometry.mirror.size(); ++i) {
    geometry.mirror[i] = unit_interval(derive_seed(seed, i)) < p;
    if (geometry.mirror[i] && before_crop) geometry.shift_x[i] = -geometry.shift_x[i];
  }
}

// out[n, c, y, x] = value(c, in[n, c, y + dy, mirror ? W - 1 - x + dx : x + dx]), and fill[c]
// where the source position falls outside the H x W input. Both tensors contiguous NCHW.
template <typename In, typename Out, typename Value>
void gather_shifted(const In* in, Out* out, at::IntArrayRef shape, const SampleGeometry& geometry,
                    const std::vector<Out>& fill, Value value) {
  const int64_t samples = shape[0], channels = shape[1], height = shape[2], width = shape[3];
  for (int64_t n = 0; n < samples; ++n) {
    const int64_t dy = geometry.shift_y[n], dx = geometry.shift_x[n];
    const bool mirror = geometry.mirror[n];
    // Output columns [lo, hi) read inside the source row.
    const int64_t lo = std::clamp<int64_t>(mirror ? dx : -dx, 0, width);
    const int64_t hi = std::clamp<int64_t>(mirror ? width + dx : width - dx, lo, width);
    for (int64_t c = 0; c < channels; ++c) {
      const In* plane = in + (n * channels + c) * height * width;
      Out* out_plane = out + (n * channels + c) * height * width;
      for (int64_t y = 0; y < height; ++y) {
        Out* row = out_plane + y * width;
        const int64_t source_y = y + dy;
        if (source_y < 0 || source_y >= height) {
          std::fill(row, row + width, fill[c]);
          continue;
        }
        const In* source = plane + source_y * width;
        std::fill(row, row + lo, fill[c]);
        if (mirror) {
          for (int64_t x = lo; x < hi; ++x) row[x] = value(c, source[width - 1 - x + dx]);
        } else {
          for (int64_t x = lo; x < hi; ++x) row[x] = value(c, source[x + dx]);
        }
        std::fill(row + hi, row + width, fill[c]);
      }
    }
  }
}

// Moves pixels per `geometry`, keeping the dtype.
torch::Tensor shift_and_mirror(const torch::Tensor& input, const SampleGeometry& geometry, double fill) {
  torch::Tensor source = input.contiguous();
  torch::Tensor result = torch::empty_like(source);
  AT_DISPATCH_ALL_TYPES(source.scalar_type(), "shift_and_mirror", [&] {
    std::vector<scalar_t> fills(source.size(1), static_cast<scalar_t>(fill));
    gather_shifted(source.data_ptr<scalar_t>(), result.data_ptr<scalar_t>(), source.sizes(), geometry, fills,
                   [](int64_t, scalar_t v) { return v; });
  });
  return result;
}

class ToFloat : public BatchTransform {
 public:
  explicit ToFloat(double scale) : scale_(static_cast<float>(scale)) {}
  Batch operator()(Batch batch, uint64_t) const override {
    batch.input = batch.input.to(torch::kFloat).mul(scale_);
    return batch;
  }
  std::string describe() const override { return fmt::format("to_float(scale={})", scale_); }
  // The same float arithmetic as operator(), for one value.
  float apply(float x) const { return x * scale_; }

 private:
  float scale_;
};

class Normalize : public BatchTransform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std) {
    if (mean.empty() || mean.size() != std.size()) {
      throw UsageError("normalize", fmt::format("needs as many means as stds (at least one), got {} and {}",
                                                mean.size(), std.size()));
    }
    for (size_t c = 0; c < mean.size(); ++c) {
      if (!(std[c] > 0)) throw UsageError("normalize", fmt::format("std[{}] = {} is not positive", c, std[c]));
      mean_.push_back(static_cast<float>(mean[c]));
      std_.push_back(std[c]);
      inv_std_.push_back(static_cast<float>(1.0 / std[c]));
    }
  }

  Batch operator()(Batch batch, uint64_t) const override {
    const torch::Tensor& input = batch.input;
    if (!input.is_floating_point()) {
      throw UsageError("normalize", fmt::format("expects float input, got {} (apply to_float first)",
                                                c10::toString(input.scalar_type())));
    }
    if (input.dim() < 2) throw UsageError("normalize", "expects [N, C, ...] input");
    check_channels(input.size(1));
    std::vector<int64_t> per_channel(input.dim(), 1);
    per_channel[1] = static_cast<int64_t>(mean_.size());
    auto mean = torch::tensor(mean_).view(per_channel);
    auto inv_std = torch::tensor(inv_std_).view(per_channel);
    batch.input = (input - mean) * inv_std;
    return batch;
  }

  std::string describe() const override {
    return fmt::format("normalize(mean=[{}], std=[{}])", fmt::join(mean_, ", "), fmt::join(std_, ", "));
  }

  void check_channels(int64_t channels) const {
    if (mean_.size() != 1 && static_cast<int64_t>(mean_.size()) != channels) {
      throw UsageError("normalize", fmt::format("has {} channel means but the input has {} channels", mean_.size(),
                                                channels));
    }
  }
  // The same float arithmetic as operator(), for one value of channel c.
  float apply(int64_t c, float x) const {
    const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    return (x - mean_[k]) * inv_std_[k];
  }

 private:
  std::vector<float> mean_, inv_std_;
  std::vector<double> std_;
};

class RandomCrop : public BatchTransform {
 public:
  RandomCrop(int64_t padding, double fill) : padding_(padding), fill_(fill) {
    if (padding < 0) throw UsageError("random_crop", fmt::format("padding {} is negative", padding));
  }
  Batch operator()(Batch batch, uint64_t seed) const override {
    check_image_batch("random_crop", batch.input);
    SampleGeometry geometry(batch.input.size(0));
    draw(geometry, seed);
    batch.input = shift_and_mirror(batch.input, geometry, fill_);
    return batch;
  }
  std::string describe() const override { return fmt::format("random_crop(padding={}, fill={})", padding_, fill_); }
  void draw(SampleGeometry& geometry, uint64_t seed) const { draw_crop(geometry, padding_, seed); }
  double fill() const { return fill_; }

 private:
  int64_t padding_;
  double fill_;
};

class RandomHorizontalFlip : public BatchTransform {
 public:
  explicit RandomHorizontalFlip(double p) : p_(p) {
    if (!(p >= 0 && p <= 1)) throw UsageError("random_horizontal_flip", fmt::format("p = {} is not in [0, 1]", p));
  }
  Batch operator()(Batch batch, uint64_t seed) const override {
    check_image_batch("random_horizontal_flip", batch.input);
    SampleGeometry geometry(batch.input.size(0));
    draw(geometry, seed, /*before_crop=*/false);
    batch.input = shift_and_mirror(batch.input, geometry, 0.0);
    return batch;
  }
  std::string describe() const override { return fmt::format("random_horizontal_flip(p={})", p_); }
  void draw(SampleGeometry& geometry, uint64_t seed, bool before_crop) const {
    draw_mirror(geometry, p_, seed, before_crop);
  }

 private:
  double p_;
};

// to_float, then any of normalize / random_crop / random_horizontal_flip at most once each.
struct ImageChain {
  const ToFloat* to_float = nullptr;
  const Normalize* normalize = nullptr;
  const RandomCrop* crop = nullptr;
  const RandomHorizontalFlip* flip = nullptr;
  size_t normalize_stage = 0, crop_stage = 0, flip_stage = 0;

  static std::optional<ImageChain> recognise(const std::vector<TransformPtr>& stages) {
    ImageChain chain;
    if (stages.empty() || !(chain.to_float = dynamic_cast<const ToFloat*>(stages[0].get()))) return std::nullopt;
    for (size_t k = 1; k < stages.size(); ++k) {
      const BatchTransform* stage = stages[k].get();
      if (!(claim(chain.normalize, chain.normalize_stage, stage, k) || claim(chain.crop, chain.crop_stage, stage, k) ||
            claim(chain.flip, chain.flip_stage, stage, k))) {
        return std::nullopt;
      }
    }
    return chain;
  }

  // One pass: out = lut[c][uint8], the lookup table holding each stage's float arithmetic, at
  // positions moved by the crop and flip; padding is the crop's fill as the stages after the
  // crop transform it.
  torch::Tensor apply(const torch::Tensor& uint8_input, uint64_t seed) const {
    torch::Tensor input = uint8_input.contiguous();
    const int64_t samples = input.size(0), channels = input.size(1);
    if (normalize) normalize->check_channels(channels);

    std::vector<float> lut(channels * 256);
    for (int64_t c = 0; c < channels; ++c) {
      for (int v = 0; v < 256; ++v) lut[c * 256 + v] = pointwise(c, to_float->apply(static_cast<float>(v)));
    }
    std::vector<float> fill(channels, 0.0f);
    if (crop) {
      for (int64_t c = 0; c < channels; ++c) {
        const auto value = static_cast<float>(crop->fill());
        fill[c] = normalize && normalize_stage > crop_stage ? normalize->apply(c, value) : value;
      }
    }
    SampleGeometry geometry(samples);
    if (crop) crop->draw(geometry, derive_seed(seed, crop_stage));
    if (flip) flip->draw(geometry, derive_seed(seed, flip_stage), /*before_crop=*/crop && flip_stage < crop_stage);

    torch::Tensor result = torch::empty(input.sizes(), torch::kFloat);
    gather_shifted(input.data_ptr<uint8_t>(), result.data_ptr<float>(), input.sizes(), geometry, fill,
                   [&lut](int64_t c, uint8_t v) { return lut[c * 256 + v]; });
    return result;
  }

 private:
  template <typename Stage>
  static bool claim(const Stage*& slot, size_t& slot_stage, const BatchTransform* stage, size_t k) {
    auto* typed = dynamic_cast<const Stage*>(stage);
    if (!typed || slot) return false;
    slot = typed;
    slot_stage = k;
    return true;
  }

  float pointwise(int64_t c, float x) const { return normalize ? normalize->apply(c, x) : x; }
};

class Compose : public BatchTransform {
 public:
  explicit Compose(std::vector<TransformPtr> stages) : stages_(std::move(stages)) {
    for (size_t k = 0; k < stages_.size(); ++k) {
      if (!stages_[k]) throw UsageError("compose", fmt::format("transform {} is null", k));
    }
    chain_ = ImageChain::recognise(stages_);
  }

  Batch operator()(Batch batch, uint64_t seed) const override {
    if (chain_ && batch.input.scalar_type() == torch::kByte && batch.input.dim() == 4) {
      batch.input = chain_->apply(batch.input, seed);
      return batch;
    }
    for (size_t k = 0; k < stages_.size(); ++k) batch = (*stages_[k])(std::move(batch), derive_seed(seed, k));
    return batch;
  }

  std::string describe() const override {
    std::vector<std::string> parts;
    for (const auto& stage : stages_) parts.push_back(stage->describe());
    return fmt::format("{}compose({})", chain_ ? "fused_" : "", fmt::join(parts, ", "));
  }

 private:
  std::vector<TransformPtr> stages_;
  std::optional<ImageChain> chain_;
};

}  // namespace

TransformPtr to_float(double scale) { return std::make_shared<ToFloat>(scale); }

TransformPtr normalize(std::vector<double> mean, std::vector<double> std) {
  return std::make_shared<Normalize>(std::move(mean), std::move(std));
}

TransformPtr random_crop(int64_t padding, double fill) { return std::make_shared<RandomCrop>(padding, fill); }

TransformPtr random_horizontal_flip(double p) { return std::make_shared<RandomHorizontalFlip>(p); }

TransformPtr compose(std::vector<TransformPtr> transforms) { return std::make_shared<Compose>(std::move(transforms)); }

}  // namespace afterburner::data
