// Mixed precision: the autocast guard for the forward pass and the GradScaler that keeps
// fp16 gradients from underflowing.
//
//   afterburner::train::GradScaler scaler(GradScalerOptions().init_scale(65536));
//   {
//     afterburner::train::AutocastGuard autocast(Precision::bf16);   // CPU autocast
//     loss = criterion(model->forward(x), y);
//   }
//   scaler.scale(loss).backward();
//   scaler.unscale(optimizer);                 // before clipping
//   clip_grad_norm(model->parameters(), 1.0);
//   bool stepped = scaler.step(optimizer);     // false when a gradient was inf/NaN
//   scaler.update();
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <string>

#include "afterburner/core/cpu.h"

namespace afterburner::train {

enum class Precision { fp32, bf16, fp16 };

Precision parse_precision(const std::string& name);  // "fp32" | "bf16" | "fp16"; UsageError otherwise
std::string to_string(Precision precision);

// bf16 is the default precision where the CPU computes it natively.
using afterburner::cpu_has_native_bf16;

// Throws UsageError when `precision` cannot run on `device` with this LibTorch: CPU autocast
// in LibTorch accepts bf16 only, so fp16 on CPU is refused with one clear line.
void check_precision_supported(Precision precision, const torch::Device& device);

// Enables autocast to the precision's dtype for its lifetime (no-op for fp32) and restores
// the previous state and clears the autocast weight cache on exit.
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, const torch::Device& device = torch::kCPU);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
  TORCH_ARG(bool, enabled) = true;
};

// Dynamic loss scaling (as torch.cuda.amp.GradScaler): multiply the loss by `scale` before
// backward; divide the gradients by it before the step; skip the step and shrink the scale by
// backoff_factor when any gradient is inf/NaN; grow it by growth_factor after
// growth_interval clean steps in a row.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides every gradient by the scale, once per step, and records whether any is inf/NaN.
  void unscale(torch::optim::Optimizer& optimizer);
  // Unscales if not done yet; steps unless a gradient was inf/NaN. Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Adjusts the scale from this step's finding; call once per step after step().
  void update();

  double current_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }

  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace afterburner::train
