#include "afterburner/kernels/flat_optim.h"

#include <ATen/Parallel.h>
#include <c10/util/strides.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <unordered_set>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "afterburner/core/error.h"

namespace afterburner::kernels {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;
using torch::optim::SGDOptions;
using torch::optim::SGDParamState;

// Elements per parallel chunk; a group smaller than this is stepped by one thread.
constexpr int64_t kGrainSize = 1 << 15;
// Each parameter starts on a 64-byte line of the flat buffer, as it would on its own.
constexpr int64_t kSlotAlignment = 16;

// The build targets baseline x86-64 (SSE2); like LibTorch's own kernels, the update loops pick
// an AVX2 version at load time where the CPU has it (no FMA, so both round alike).
#if defined(__x86_64__) && defined(__GNUC__)
#define AFTERBURNER_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define AFTERBURNER_AVX2_CLONES
#endif

struct SgdConstants {
  float lr;
  float weight_decay;
  float momentum;
  float dampening_complement;  // 1 - dampening
};

// A gradient value: float32 as is, or a bf16 copy's gradient (its bits), widened exactly (the bf16
// bits are the float's upper half).
[[gnu::always_inline]] inline float gradient(const float* g, int64_t i) { return g[i]; }
[[gnu::always_inline]] inline float gradient(const uint16_t* g, int64_t i) {
  const uint32_t word = uint32_t(g[i]) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// float32 -> bfloat16 bits as LibTorch's tensor cast (Tensor::to, autocast's) writes them: rounded
// to nearest even, every NaN as 0xFFFF (c10::BFloat16's scalar conversion writes 0x7FC0 instead).
// On bits, so that the loops vectorize.
[[gnu::always_inline]] inline uint16_t bf16_bits(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint32_t rounded = (word + 0x7FFFu + ((word >> 16) & 1u)) >> 16;
  return uint16_t((word & 0x7FFFFFFFu) > 0x7F800000u ? 0xFFFFu : rounded);
}

// Calls kernel(gradient, copy) with the chunk's gradient type and, for a copy, a pointer (else
// nullptr_t), so that each combination compiles to a loop of its own. Inlined, with the kernel,
// into the AVX2 clone that calls it.
template <typename Kernel>
[[gnu::always_inline]] inline void with_chunk_io(const FlatChunk& io, const Kernel& kernel) {
  if (io.grad_bf16 != nullptr) {
    io.copy != nullptr ? kernel(io.grad_bf16, io.copy) : kernel(io.grad_bf16, nullptr);
  } else {
    io.copy != nullptr ? kernel(io.grad, io.copy) : kernel(io.grad, nullptr);
  }
}

// SGD as torch::optim::SGD: d = g + wd*p; with momentum, buf = d on the parameter's first
// step, else buf = momentum*buf + (1 - dampening)*d, and d = nesterov ? d + momentum*buf : buf;
// then p -= lr*d (and copy = bf16(p)). The flags and the gradient's and copy's types are template
// arguments so each loop is branch-free and vectorizes.
template <bool kMomentum, bool kFirstStep, bool kNesterov, typename Grad, typename Copy>
[[gnu::always_inline]] inline void sgd_kernel(float* __restrict p, const Grad* __restrict g, float* __restrict buf,
                                              Copy copy, int64_t n, const SgdConstants& c) {
  const float lr = c.lr, weight_decay = c.weight_decay, momentum = c.momentum, keep = c.dampening_complement;
  uint16_t* __restrict out = nullptr;
  if constexpr (!std::is_same_v<Copy, std::nullptr_t>) out = copy;
  for (int64_t i = 0; i < n; ++i) {
    float d = gradient(g, i) + weight_decay * p[i];
    if constexpr (kMomentum) {
      const float b = kFirstStep ? d : momentum * buf[i] + keep * d;
      buf[i] = b;
      d = kNesterov ? d + momentum * b : b;
    }
    const float stepped = p[i] - lr * d;
    p[i] = stepped;
    if constexpr (!std::is_same_v<Copy, std::nullptr_t>) out[i] = bf16_bits(stepped);
  }
}

AFTERBURNER_AVX2_CLONES void sgd_update(float* p, const FlatChunk& io, float* buf, int64_t n, const SgdConstants& c,
                                        bool first_step, bool nesterov) {
  const auto kernel = [&](auto g, auto copy) __attribute__((always_inline)) {
    using Grad = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    using Copy = decltype(copy);
    if (buf == nullptr) return sgd_kernel<false, false, false, Grad, Copy>(p, g, buf, copy, n, c);
    if (first_step) {
      return nesterov ? sgd_kernel<true, true, true, Grad, Copy>(p, g, buf, copy, n, c)
                      : sgd_kernel<true, true, false, Grad, Copy>(p, g, buf, copy, n, c);
    }
    return nesterov ? sgd_kernel<true, false, true, Grad, Copy>(p, g, buf, copy, n, c)
                    : sgd_kernel<true, false, false, Grad, Copy>(p, g, buf, copy, n, c);
  };
  with_chunk_io(io, kernel);
}

struct AdamWConstants {
  float decay;  // 1 - lr*weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
};

// Per parameter, since AdamW counts steps per parameter.
struct BiasCorrection {
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
};

// out = sqrt(in). std::sqrt keeps a loop scalar unless built with -fno-math-errno (it may have
// to set errno), which made AdamW's step 4x slower; _mm_sqrt_ps is the same IEEE sqrt.
void sqrt_lanes(const float* __restrict in, float* __restrict out, int64_t n) {
  int64_t i = 0;
#if defined(__SSE__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = std::sqrt(in[i]);
}

// AdamW as torch::optim::AdamW at a parameter's step t: p *= 1 - lr*wd; m = b1*m + (1-b1)*g;
// v = b2*v + (1-b2)*g*g; p -= lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps) (and copy =
// bf16(p)). Blocks of kBlock elements stay in L1 between the moment update, the square roots and
// the step.
template <typename Grad, typename Copy>
[[gnu::always_inline]] inline void adamw_kernel(float* p, const Grad* g, float* m, float* v, Copy copy, int64_t n,
                                                const AdamWConstants& c, const BiasCorrection& bc) {
  constexpr int64_t kBlock = 256;
  const float decay = c.decay, beta1 = c.beta1, keep1 = c.one_minus_beta1, beta2 = c.beta2, keep2 = c.one_minus_beta2,
              eps = c.eps, step_size = bc.step_size, inv_sqrt_bc2 = bc.inv_sqrt_bc2;
  float root[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    float* __restrict pb = p + start;
    const Grad* __restrict gb = g + start;
    float* __restrict mb = m + start;
    float* __restrict vb = v + start;
    for (int64_t i = 0; i < len; ++i) {
      const float grad = gradient(gb, i);
      mb[i] = beta1 * mb[i] + keep1 * grad;
      vb[i] = beta2 * vb[i] + keep2 * grad * grad;
    }
    sqrt_lanes(vb, root, len);
    for (int64_t i = 0; i < len; ++i) pb[i] = pb[i] * decay - step_size * mb[i] / (root[i] * inv_sqrt_bc2 + eps);
    if constexpr (!std::is_same_v<Copy, std::nullptr_t>) {
      uint16_t* __restrict out = copy + start;
      for (int64_t i = 0; i < len; ++i) out[i] = bf16_bits(pb[i]);
    }
  }
}

AFTERBURNER_AVX2_CLONES void adamw_update(float* p, const FlatChunk& io, float* m, float* v, int64_t n,
                                          const AdamWConstants& c, const BiasCorrection& bc) {
  const auto kernel = [&](auto g, auto copy) __attribute__((always_inline)) {
    return adamw_kernel<std::remove_const_t<std::remove_pointer_t<decltype(g)>>, decltype(copy)>(p, g, m, v, copy, n,
                                                                                                  c, bc);
  };
  with_chunk_io(io, kernel);
}

// Calls visit(k, from, to) for each part [from, to) of tensor k (numels[k] elements) covered by
// a chunk of the tensors laid end to end; chunks of kGrainSize run in parallel on LibTorch's
// intra-op threads.
void for_each_chunk(const std::vector<int64_t>& numels, const std::function<void(size_t, int64_t, int64_t)>& visit) {
  std::vector<int64_t> starts;
  int64_t total = 0;
  for (int64_t numel : numels) {
    starts.push_back(total);
    total += numel;
  }
  at::parallel_for(0, total, kGrainSize, [&](int64_t begin, int64_t end) {
    size_t k = size_t(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) - 1;
    for (; k < numels.size() && starts[k] < end; ++k) {
      const int64_t from = std::max(begin, starts[k]) - starts[k];
      const int64_t to = std::min(end, starts[k] + numels[k]) - starts[k];
      if (from < to) visit(k, from, to);
    }
  });
}

SgdConstants sgd_constants(const SGDOptions& options) {
  return {float(options.lr()), float(options.weight_decay()), float(options.momentum()), float(1 - options.dampening())};
}

AdamWConstants adamw_constants(const AdamWOptions& options) {
  const auto [beta1, beta2] = options.betas();
  AdamWConstants constants;
  constants.decay = float(1 - options.lr() * options.weight_decay());
  constants.beta1 = float(beta1);
  constants.one_minus_beta1 = float(1 - beta1);
  constants.beta2 = float(beta2);
  constants.one_minus_beta2 = float(1 - beta2);
  constants.eps = float(options.eps());
  return constants;
}

BiasCorrection bias_correction(const AdamWOptions& options, int64_t step) {
  const double bc1 = 1 - std::pow(std::get<0>(options.betas()), double(step));
  const double bc2 = 1 - std::pow(std::get<1>(options.betas()), double(step));
  return {float(options.lr() / bc1), float(1 / std::sqrt(bc2))};
}

std::string option_field(const std::string& optimizer, size_t group, const char* option) {
  return fmt::format("{} param_groups[{}].{}", optimizer, group, option);
}

std::string param_field(size_t group, size_t param) { return fmt::format("param_groups[{}].params[{}]", group, param); }

// Option checks run at every step (options may change at any time), so messages are built
// only on failure.
void check_non_negative(double value, const std::string& name, size_t group, const char* option) {
  if (!(value >= 0)) {
    throw UsageError(option_field(name, group, option), fmt::format("must not be negative (got {})", value));
  }
}

// The checks torch's constructors make, for every group.
void check_options(const std::string& name, size_t group, const SGDOptions& o) {
  check_non_negative(o.lr(), name, group, "lr");
  check_non_negative(o.momentum(), name, group, "momentum");
  check_non_negative(o.weight_decay(), name, group, "weight_decay");
  if (o.nesterov() && !(o.momentum() > 0 && o.dampening() == 0)) {
    throw UsageError(option_field(name, group, "nesterov"), "needs momentum > 0 and dampening 0");
  }
}

void check_options(const std::string& name, size_t group, const AdamWOptions& o) {
  check_non_negative(o.lr(), name, group, "lr");
  check_non_negative(o.eps(), name, group, "eps");
  check_non_negative(o.weight_decay(), name, group, "weight_decay");
  const auto [beta1, beta2] = o.betas();
  if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) {
    throw UsageError(option_field(name, group, "betas"),
                     fmt::format("must both be in [0, 1) (got {}, {})", beta1, beta2));
  }
  if (o.amsgrad()) {
    throw UsageError(option_field(name, group, "amsgrad"), "is not supported; use torch::optim::AdamW for it");
  }
}

}  // namespace

FlatOptimizer::FlatOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                             std::unique_ptr<torch::optim::OptimizerOptions> defaults, std::string name,
                             std::vector<std::string> state_fields)
    : Optimizer(std::move(param_groups), std::move(defaults)),
      name_(std::move(name)),
      state_fields_(std::move(state_fields)) {}

torch::Tensor FlatOptimizer::slice(const torch::Tensor& flat, const Slot& slot) {
  // set_ rather than as_strided: autograd would mark an as_strided result a view, and
  // Optimizer::zero_grad / Module::zero_grad call detach_() on gradients, which refuses views.
  return torch::empty({0}, flat.options()).set_(flat.storage(), slot.offset, slot.sizes, slot.strides);
}

bool FlatOptimizer::is_slice(const torch::Tensor& tensor, const torch::Tensor& flat, const Slot& slot) {
  return tensor.defined() && flat.defined() && tensor.data_ptr() == flat.data_ptr<float>() + slot.offset &&
         tensor.strides() == slot.strides && tensor.sizes() == slot.sizes;
}

void FlatOptimizer::flatten_new_groups() {
  if (groups_.size() == param_groups_.size()) return;
  torch::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!seen.insert(params[i].unsafeGetTensorImpl()).second) {
        throw UsageError(name_ + " " + param_field(g, i),
                         "is listed twice (each parameter may appear once across all groups)");
      }
    }
  }
  while (groups_.size() < param_groups_.size()) flatten_group(groups_.size());
}

void FlatOptimizer::check_param(size_t group, size_t param) const {
  const torch::Tensor& p = param_groups_[group].params()[param];
  std::string problem;
  if (!p.defined()) {
    problem = "is an undefined tensor";
  } else if (p.layout() != torch::kStrided) {
    problem = "is sparse; only dense parameters are supported";
  } else if (!p.device().is_cpu()) {
    problem = "is on " + p.device().str() + "; " + name_ + " runs on the CPU";
  } else if (p.scalar_type() != torch::kFloat) {
    problem = std::string("is ") + c10::toString(p.scalar_type()) + "; " + name_ +
              " steps float32 parameters only (for bf16 keep fp32 weights and train under autocast)";
  }
  if (!problem.empty()) throw UsageError(name_ + " " + param_field(group, param), problem);
}

void FlatOptimizer::flatten_group(size_t group) {
  const auto& params = param_groups_[group].params();
  FlatGroup flat;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    check_param(group, i);
    const torch::Tensor& p = params[i];
    Slot slot;
    slot.offset = total;
    slot.numel = p.numel();
    slot.sizes = p.sizes().vec();
    // A dense layout (channels_last included) is kept, so the parameter's kernels see no change.
    const auto dense_strides =
        p.is_non_overlapping_and_dense() ? c10::DimVector(p.strides()) : c10::contiguous_strides(p.sizes());
    slot.strides.assign(dense_strides.begin(), dense_strides.end());
    slot.state_key = c10::guts::to_string(p.unsafeGetTensorImpl());
    flat.slots.push_back(std::move(slot));
    total += (p.numel() + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  }
  flat.params = torch::zeros({total}, torch::dtype(torch::kFloat));
  flat.state_buffers.resize(state_fields_.size());
  flat.copy_of.resize(params.size());
  groups_.push_back(std::move(flat));
  rehome_moved_params(group);
}

void FlatOptimizer::rehome_moved_params(size_t group) {
  FlatGroup& flat = groups_[group];
  auto& params = param_groups_[group].params();
  for (size_t i = 0; i < params.size(); ++i) {
    const Slot& slot = flat.slots[i];
    if (slot.numel == 0 || is_slice(params[i], flat.params, slot)) continue;
    check_param(group, i);
    if (params[i].sizes() != slot.sizes) {
      throw UsageError(name_ + " " + param_field(group, i),
                       fmt::format("changed shape from {} to {} after the optimizer was built",
                                   c10::IntArrayRef(slot.sizes), params[i].sizes()));
    }
    torch::Tensor home = slice(flat.params, slot);
    home.copy_(params[i]);
    params[i].set_data(home);
  }
}

bool FlatOptimizer::grad_in_place(size_t group, size_t param) const {
  return is_slice(param_groups_[group].params()[param].grad(), groups_[group].grads, groups_[group].slots[param]);
}

torch::Tensor& FlatOptimizer::grad_buffer(size_t group) {
  FlatGroup& flat = groups_[group];
  if (!flat.grads.defined()) flat.grads = torch::zeros({flat.params.numel()}, flat.params.options());
  return flat.grads;
}

FlatOptimizer::Gradients FlatOptimizer::gather_gradients(size_t group) {
  rehome_moved_params(group);
  grad_buffer(group);
  Gradients gradients;
  auto& params = param_groups_[group].params();
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor& grad = params[i].mutable_grad();
    const Slot& slot = groups_[group].slots[i];
    const torch::Tensor& copy = groups_[group].copy_of[i].tensor;
    if (copy.defined() && copy.grad().defined() && slot.numel > 0) {
      // The copy's gradient stands for the parameter's; read in the slot's memory order.
      const torch::Tensor& copy_grad = copy.grad();
      const bool in_order = copy_grad.scalar_type() == torch::kBFloat16 && copy_grad.strides() == slot.strides;
      gradients.params.push_back(i);
      gradients.outside.push_back(
          in_order ? copy_grad : torch::empty_strided(slot.sizes, slot.strides, torch::kBFloat16).copy_(copy_grad));
      continue;
    }
    if (copy.defined() && !grad.defined() && groups_[group].copy_of[i].had_gradient) {
      grad = slice(groups_[group].grads, slot).zero_();
    }
    if (!grad.defined() || slot.numel == 0) continue;
    if (grad.is_sparse() || grad.sizes() != slot.sizes) {
      throw UsageError(name_ + " " + param_field(group, i) + ".grad()",
                       grad.is_sparse()
                           ? "is sparse; only dense gradients are supported"
                           : fmt::format("has shape {} but the parameter has {}", grad.sizes(), params[i].sizes()));
    }
    torch::Tensor outside;
    if (!grad_in_place(group, i)) {
      // Same dtype and memory order: step_group copies it in while stepping. Otherwise now.
      if (grad.scalar_type() == torch::kFloat && grad.device().is_cpu() && grad.strides() == slot.strides) {
        outside = grad;
      } else {
        torch::Tensor home = slice(groups_[group].grads, slot);
        home.copy_(grad);
        grad = home;
      }
    }
    gradients.params.push_back(i);
    gradients.outside.push_back(outside);
  }
  return gradients;
}

void FlatOptimizer::zero_grad() {
  torch::NoGradGuard no_grad;
  flatten_new_groups();
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor& grad = params[i].mutable_grad();
      if (grad.defined() && groups_[g].slots[i].numel > 0 && !grad_in_place(g, i)) {
        grad = slice(grad_buffer(g), groups_[g].slots[i]);
      }
      if (groups_[g].copy_of[i].tensor.defined()) groups_[g].copy_of[i].tensor.mutable_grad().reset();
    }
    if (!groups_[g].grads.defined()) continue;
    if (!groups_[g].copies.defined()) {
      groups_[g].grads.zero_();
      continue;
    }
    // Parameters with a copy get their gradients on the copy: their slots are not worth a pass.
    // The others' slots are zeroed in runs of neighbours, one memset each.
    float* grads = groups_[g].grads.data_ptr<float>();
    const std::vector<Slot>& slots = groups_[g].slots;
    for (size_t i = 0; i < params.size();) {
      const auto zeroed = [&](size_t k) { return !groups_[g].copy_of[k].tensor.defined() || params[k].grad().defined(); };
      if (!zeroed(i)) {
        ++i;
        continue;
      }
      size_t end = i + 1;
      while (end < params.size() && zeroed(end)) ++end;
      const int64_t last = slots[end - 1].offset + slots[end - 1].numel;
      std::memset(grads + slots[i].offset, 0, size_t(last - slots[i].offset) * sizeof(float));
      i = end;
    }
  }
}

void FlatOptimizer::step_group(size_t group, const Gradients& gradients, const Update& update) {
  FlatGroup& flat = groups_[group];
  const std::vector<size_t>& params = gradients.params;
  std::vector<int64_t> numels;
  std::vector<const float*> outside;
  std::vector<const uint16_t*> outside_bf16;
  std::vector<uint16_t*> copies;
  for (size_t k = 0; k < params.size(); ++k) {
    numels.push_back(flat.slots[params[k]].numel);
    const torch::Tensor& grad = gradients.outside[k];
    const bool bf16 = grad.defined() && grad.scalar_type() == torch::kBFloat16;
    outside.push_back(grad.defined() && !bf16 ? grad.data_ptr<float>() : nullptr);
    outside_bf16.push_back(bf16 ? reinterpret_cast<const uint16_t*>(grad.data_ptr<c10::BFloat16>()) : nullptr);
    copies.push_back(flat.copy_of[params[k]].tensor.defined()
                         ? reinterpret_cast<uint16_t*>(flat.copies.data_ptr<c10::BFloat16>()) + flat.slots[params[k]].offset
                         : nullptr);
  }
  float* grads = flat.grads.data_ptr<float>();
  for_each_chunk(numels, [&](size_t k, int64_t from, int64_t to) {
    const int64_t offset = flat.slots[params[k]].offset + from, n = to - from;
    FlatChunk io;
    io.copy = copies[k] != nullptr ? copies[k] + from : nullptr;
    if (outside_bf16[k] != nullptr) {
      io.grad_bf16 = outside_bf16[k] + from;  // read as it is: the parameter's gradient is not written
    } else {
      // A chunk (at most kGrainSize values) copied in stays in cache for the update that reads it.
      if (outside[k] != nullptr) std::memcpy(grads + offset, outside[k] + from, size_t(n) * sizeof(float));
      io.grad = grads + offset;
    }
    update(params[k], offset, n, io);
  });
  auto& group_params = param_groups_[group].params();
  for (size_t k = 0; k < params.size(); ++k) {
    if (outside[k] != nullptr) group_params[params[k]].mutable_grad() = slice(flat.grads, flat.slots[params[k]]);
    Bf16Copy& copy = flat.copy_of[params[k]];
    if (!copy.tensor.defined()) continue;
    copy.had_gradient = copy.had_gradient || gradients.outside[k].defined();
    copy.tensor.mutable_grad().reset();
    copy.written_from = group_params[params[k]].data_ptr();
    copy.version = group_params[params[k]]._version();
  }
}

torch::Tensor FlatOptimizer::bf16_copy(const torch::Tensor& param) {
  torch::NoGradGuard no_grad;
  flatten_new_groups();
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_same(param)) continue;
      FlatGroup& flat = groups_[g];
      Bf16Copy& copy = flat.copy_of[i];
      if (copy.tensor.defined()) return copy.tensor;
      if (!flat.copies.defined()) flat.copies = torch::empty({flat.params.numel()}, torch::kBFloat16);
      copy.tensor = slice(flat.copies, flat.slots[i]);
      copy.tensor.set_requires_grad(true);
      write_copy(g, i);
      return copy.tensor;
    }
  }
  throw UsageError(name_ + " bf16_copy", "the tensor is not one of this optimizer's parameters");
}

void FlatOptimizer::write_copy(size_t group, size_t param) {
  const torch::Tensor& source = param_groups_[group].params()[param];
  Bf16Copy& copy = groups_[group].copy_of[param];
  copy.tensor.detach().copy_(source);  // LibTorch's own cast: autocast's bits
  copy.written_from = source.data_ptr();
  copy.version = source._version();
}

void FlatOptimizer::refresh_bf16_copies() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < groups_[g].copy_of.size(); ++i) {
      const Bf16Copy& copy = groups_[g].copy_of[i];
      if (!copy.tensor.defined()) continue;
      if (copy.written_from != params[i].data_ptr() || copy.version != params[i]._version()) write_copy(g, i);
    }
  }
}

const FlatOptimizer::FlatGroup& FlatOptimizer::flat_group(size_t group) const {
  if (group >= groups_.size()) {
    throw UsageError(name_ + " group", fmt::format("{} is out of range ({} flat groups; groups added later become "
                                                   "flat at the next step)",
                                                   group, groups_.size()));
  }
  return groups_[group];
}

torch::Tensor FlatOptimizer::flat_params(size_t group) const { return flat_group(group).params; }
torch::Tensor FlatOptimizer::flat_grads(size_t group) const { return flat_group(group).grads; }

float* FlatOptimizer::params_data(size_t group) { return groups_[group].params.data_ptr<float>(); }
float* FlatOptimizer::state_data(size_t group, size_t field) { return state_buffer(group, field).data_ptr<float>(); }

torch::Tensor& FlatOptimizer::state_buffer(size_t group, size_t field) {
  torch::Tensor& buffer = groups_[group].state_buffers[field];
  if (!buffer.defined()) buffer = torch::zeros({groups_[group].params.numel()}, groups_[group].params.options());
  return buffer;
}

torch::Tensor FlatOptimizer::state_slice(size_t group, size_t param, size_t field) {
  return slice(state_buffer(group, field), groups_[group].slots[param]);
}

const std::string& FlatOptimizer::state_key(size_t group, size_t param) const {
  return groups_[group].slots[param].state_key;
}

void FlatOptimizer::adopt_loaded_state() {
  torch::NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    rehome_moved_params(g);
    for (size_t i = 0; i < groups_[g].slots.size(); ++i) {
      const Slot& slot = groups_[g].slots[i];
      auto entry = state_.find(slot.state_key);
      if (entry == state_.end()) continue;
      std::vector<torch::Tensor*> tensors = state_tensors(*entry->second);
      for (size_t k = 0; k < tensors.size(); ++k) {
        torch::Tensor& loaded = *tensors[k];
        const std::string what = param_field(g, i) + " " + state_fields_[k];
        if (!loaded.defined()) throw CheckpointError(name_ + " state", what + " is missing");
        if (loaded.sizes() != c10::IntArrayRef(slot.sizes)) {
          throw CheckpointError(name_ + " state", fmt::format("{} has shape {} but the parameter has {}", what,
                                                              loaded.sizes(), c10::IntArrayRef(slot.sizes)));
        }
        if (is_slice(loaded, groups_[g].state_buffers[k], slot)) continue;
        torch::Tensor home = state_slice(g, i, k);
        home.copy_(loaded);
        loaded = home;
      }
    }
  }
}

torch::Tensor FlatOptimizer::run_closure(const LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

FlatSGD::FlatSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, SGDOptions defaults)
    : FlatOptimizer(std::move(param_groups), std::make_unique<SGDOptions>(defaults), "FlatSGD", {"momentum_buffer"}) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check_options(name(), g, static_cast<const SGDOptions&>(param_groups_[g].options()));
  }
  flatten_new_groups();
}

FlatSGD::FlatSGD(std::vector<torch::Tensor> params, SGDOptions defaults)
    : FlatSGD(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
              std::move(defaults)) {}

std::vector<torch::Tensor*> FlatSGD::state_tensors(torch::optim::OptimizerParamState& state) const {
  return {&static_cast<SGDParamState&>(state).momentum_buffer()};
}

torch::Tensor FlatSGD::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  torch::NoGradGuard no_grad;
  flatten_new_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const SGDOptions&>(param_groups_[g].options());
    check_options(name(), g, options);
    const Gradients stepped = gather_gradients(g);
    if (stepped.params.empty()) continue;
    const bool momentum = options.momentum() != 0;
    // torch creates a parameter's momentum buffer at its first step with a gradient.
    std::vector<char> first_step(param_groups_[g].params().size(), 0);
    if (momentum) {
      for (size_t i : stepped.params) {
        if (state_.count(state_key(g, i)) != 0) continue;
        auto state = std::make_unique<SGDParamState>();
        state->momentum_buffer(state_slice(g, i, 0));
        state_[state_key(g, i)] = std::move(state);
        first_step[i] = 1;
      }
    }
    const SgdConstants constants = sgd_constants(options);
    float* params = params_data(g);
    float* buffers = momentum ? state_data(g, 0) : nullptr;
    const bool nesterov = options.nesterov();
    step_group(g, stepped, [&](size_t i, int64_t offset, int64_t n, const FlatChunk& io) {
      sgd_update(params + offset, io, buffers ? buffers + offset : nullptr, n, constants, first_step[i] != 0, nesterov);
    });
  }
  return loss;
}

void FlatSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
}

void FlatSGD::load(torch::serialize::InputArchive& archive) {
  flatten_new_groups();
  torch::optim::serialize<SGDParamState, SGDOptions>(archive, *this);
  adopt_loaded_state();
}

FlatAdamW::FlatAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamWOptions defaults)
    : FlatOptimizer(std::move(param_groups), std::make_unique<AdamWOptions>(defaults), "FlatAdamW",
                    {"exp_avg", "exp_avg_sq"}) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check_options(name(), g, static_cast<const AdamWOptions&>(param_groups_[g].options()));
  }
  flatten_new_groups();
}

FlatAdamW::FlatAdamW(std::vector<torch::Tensor> params, AdamWOptions defaults)
    : FlatAdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
                std::move(defaults)) {}

std::vector<torch::Tensor*> FlatAdamW::state_tensors(torch::optim::OptimizerParamState& state) const {
  auto& adamw = static_cast<AdamWParamState&>(state);
  return {&adamw.exp_avg(), &adamw.exp_avg_sq()};
}

torch::Tensor FlatAdamW::step(LossClosure closure) {
  torch::Tensor loss = run_closure(closure);
  torch::NoGradGuard no_grad;
  flatten_new_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options = static_cast<const AdamWOptions&>(param_groups_[g].options());
    check_options(name(), g, options);
    const Gradients stepped = gather_gradients(g);
    if (stepped.params.empty()) continue;
    std::vector<BiasCorrection> corrections(param_groups_[g].params().size());
    for (size_t i : stepped.params) {
      auto& entry = state_[state_key(g, i)];
      if (!entry) {
        auto state = std::make_unique<AdamWParamState>();
        state->exp_avg(state_slice(g, i, 0).zero_());
        state->exp_avg_sq(state_slice(g, i, 1).zero_());
        entry = std::move(state);
      }
      auto& state = static_cast<AdamWParamState&>(*entry);
      state.step(state.step() + 1);
      corrections[i] = bias_correction(options, state.step());
    }
    const AdamWConstants constants = adamw_constants(options);
    float* params = params_data(g);
    float* exp_avg = state_data(g, 0);
    float* exp_avg_sq = state_data(g, 1);
    step_group(g, stepped, [&](size_t i, int64_t offset, int64_t n, const FlatChunk& io) {
      adamw_update(params + offset, io, exp_avg + offset, exp_avg_sq + offset, n, constants, corrections[i]);
    });
  }
  return loss;
}

void FlatAdamW::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
}

void FlatAdamW::load(torch::serialize::InputArchive& archive) {
  flatten_new_groups();
  torch::optim::serialize<AdamWParamState, AdamWOptions>(archive, *this);
  adopt_loaded_state();
}

namespace {

// The memory one multi-tensor step reads and writes, per parameter.
struct StepOperands {
  std::vector<int64_t> numels;
  std::vector<float*> params;
  std::vector<const float*> grads;
  std::vector<std::vector<float*>> state;  // per state field, per parameter
  std::vector<torch::Tensor> grad_copies;  // gradients laid out as their parameters, alive for the step
};

void require_dense_float(const torch::Tensor& tensor, const std::string& field) {
  if (!tensor.defined() || tensor.scalar_type() != torch::kFloat || !tensor.device().is_cpu() ||
      !tensor.is_non_overlapping_and_dense()) {
    throw UsageError(field, tensor.defined() ? "expected a dense float32 CPU tensor, got " +
                                                           c10::str(tensor.scalar_type(), " ", tensor.sizes(), " on ",
                                                                    tensor.device())
                                             : std::string("expected a tensor, got none"));
  }
}

// Checks what sgd_step and adamw_step are given (see flat_optim.h) and points at its memory.
StepOperands step_operands(const std::string& optimizer, at::TensorList params, at::TensorList grads,
                           const std::vector<std::pair<const char*, at::TensorList>>& state) {
  const auto require_count = [&](const char* name, size_t count) {
    if (count != params.size()) {
      throw UsageError(optimizer + " " + name, fmt::format("expected {} tensors, one per parameter, got {}",
                                                           params.size(), count));
    }
  };
  require_count("grads", grads.size());
  for (const auto& [name, tensors] : state) require_count(name, tensors.size());
  StepOperands operands;
  operands.state.resize(state.size());
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& param = params[i];
    const std::string field = fmt::format("{} params[{}]", optimizer, i);
    require_dense_float(param, field);
    if (!seen.insert(param.data_ptr()).second) throw UsageError(field, "is listed twice");
    if (at::GradMode::is_enabled() && param.requires_grad()) {
      throw UsageError(field, "requires grad: step under torch.no_grad(), as torch's optimizers do");
    }
    torch::Tensor grad = grads[i];
    require_dense_float(grad, fmt::format("{} grads[{}]", optimizer, i));
    if (grad.sizes() != param.sizes()) {
      throw UsageError(fmt::format("{} grads[{}]", optimizer, i),
                       c10::str("has shape ", grad.sizes(), ", its parameter ", param.sizes()));
    }
    if (grad.strides() != param.strides()) {
      grad = at::empty_like(param).copy_(grad);
      operands.grad_copies.push_back(grad);
    }
    for (size_t f = 0; f < state.size(); ++f) {
      const torch::Tensor& tensor = state[f].second[i];
      const std::string state_field = fmt::format("{} {}[{}]", optimizer, state[f].first, i);
      require_dense_float(tensor, state_field);
      if (tensor.sizes() != param.sizes() || tensor.strides() != param.strides()) {
        throw UsageError(state_field, c10::str("has shape ", tensor.sizes(), " and strides ", tensor.strides(),
                                                      ", its parameter ", param.sizes(), " and ", param.strides()));
      }
      operands.state[f].push_back(tensor.data_ptr<float>());
    }
    operands.numels.push_back(param.numel());
    operands.params.push_back(param.data_ptr<float>());
    operands.grads.push_back(grad.data_ptr<float>());
  }
  return operands;
}

// Autograd's record that these tensors changed in place, as torch's own in-place ops leave it.
void bump_versions(at::TensorList tensors) {
  for (const torch::Tensor& tensor : tensors) torch::autograd::impl::bump_version(tensor);
}

}  // namespace

void sgd_step(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
              const std::vector<bool>& fresh, const SGDOptions& options) {
  check_options("sgd_step", 0, options);
  const bool momentum = options.momentum() != 0;
  if (!momentum && !momentum_buffers.empty()) {
    throw UsageError("sgd_step momentum_buffers", "must be empty without momentum");
  }
  const StepOperands operands =
      step_operands("sgd_step", params, grads, momentum ? std::vector<std::pair<const char*, at::TensorList>>{
                                                              {"momentum_buffers", momentum_buffers}}
                                                        : std::vector<std::pair<const char*, at::TensorList>>{});
  if (momentum && fresh.size() != params.size()) {
    throw UsageError("sgd_step fresh", fmt::format("expected {} flags, one per parameter, got {}", params.size(),
                                                   fresh.size()));
  }
  const SgdConstants constants = sgd_constants(options);
  for_each_chunk(operands.numels, [&](size_t k, int64_t from, int64_t to) {
    float* buffer = momentum ? operands.state[0][k] + from : nullptr;
    FlatChunk io;
    io.grad = operands.grads[k] + from;
    sgd_update(operands.params[k] + from, io, buffer, to - from, constants, momentum && fresh[k], options.nesterov());
  });
  bump_versions(params);
  bump_versions(momentum_buffers);
}

void adamw_step(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::IntArrayRef steps, const AdamWOptions& options) {
  check_options("adamw_step", 0, options);
  const StepOperands operands =
      step_operands("adamw_step", params, grads, {{"exp_avgs", exp_avgs}, {"exp_avg_sqs", exp_avg_sqs}});
  if (steps.size() != params.size()) {
    throw UsageError("adamw_step steps", fmt::format("expected {} counts, one per parameter, got {}", params.size(),
                                                     steps.size()));
  }
  std::vector<BiasCorrection> corrections;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] < 1) throw UsageError(fmt::format("adamw_step steps[{}]", i), "must be at least 1");
    corrections.push_back(bias_correction(options, steps[i]));
  }
  const AdamWConstants constants = adamw_constants(options);
  for_each_chunk(operands.numels, [&](size_t k, int64_t from, int64_t to) {
    FlatChunk io;
    io.grad = operands.grads[k] + from;
    adamw_update(operands.params[k] + from, io, operands.state[0][k] + from,
                 operands.state[1][k] + from, to - from, constants, corrections[k]);
  });
  bump_versions(params);
  bump_versions(exp_avgs);
  bump_versions(exp_avg_sqs);
}

}  // namespace afterburner::kernels
