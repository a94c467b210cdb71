// The kernel contract (developers' guide) as one table-driven check: a call leaves its inputs,
// parameters and buffers bitwise unchanged and returns memory of its own, forward and backward;
// a second call, and a call without grad mode, give bitwise the same results; and value and
// gradients match LibTorch's unfused ops (autograd of those) within a tolerance per precision,
// second-order gradients too (backward under create_graph) for the cases that ask. Every
// variant runs on finite inputs and again on inputs holding NaN, +inf and -inf, where NaN and
// infinities must come out where LibTorch's ops put them.
//
//   const OpCase relu_case{"relu", {Precision::fp32, Precision::bf16}, {{1, 7}, {13, 5}},
//                          {Layout::contiguous, Layout::transposed},
//                          [](Inputs& in, const Shape& s, Layout layout) {
//                            const torch::Tensor x = in.random({s[0], s[1]}, layout);
//                            return Trial{[x] { return my_relu(x); }, [x] { return torch::relu(x); }};
//                          }};
//   expect_kernel_contract(relu_case);   // every precision x shape x layout x values, traced on failure
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "afterburner/core/memory_format.h"
#include "autograd_check.h"
#include "non_finite.h"

namespace afterburner::testing {

// How a test input sits in memory. Where a layout does not apply to a tensor's rank (transposed
// for 1-D, channels_last for other than 4-D) the tensor is drawn strided or contiguous instead.
enum class Layout {
  contiguous,
  strided,        // every other element of the last dimension of a twice-as-wide tensor
  transposed,     // the last two dimensions swapped in memory
  expanded,       // stride 0 along the first dimension of size > 1
  channels_last,  // NHWC memory for 4-D tensors
};

inline const char* to_string(Layout layout) {
  switch (layout) {
    case Layout::contiguous: return "contiguous";
    case Layout::strided: return "strided";
    case Layout::transposed: return "transposed";
    case Layout::expanded: return "expanded";
    case Layout::channels_last: return "channels_last";
  }
  return "?";
}

// The numerics a case runs in: tensors of a dtype, or fp32 tensors under CPU bf16 autocast (the
// op and its reference inside the autocast scope, the backward after it, as training runs them).
enum class Precision { fp32, fp64, bf16, autocast_bf16 };

inline const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::fp32: return "fp32";
    case Precision::fp64: return "fp64";
    case Precision::bf16: return "bf16";
    case Precision::autocast_bf16: return "fp32 under bf16 autocast";
  }
  return "?";
}

// What the drawn inputs hold: normal values only, or also NaN, +inf and -inf (with_non_finite:
// one of each in every drawn tensor that has three elements).
enum class Values { finite, non_finite };

inline const char* to_string(Values values) { return values == Values::finite ? "finite" : "NaN, +inf and -inf"; }

inline torch::Dtype tensor_dtype(Precision precision) {
  switch (precision) {
    case Precision::fp64: return torch::kDouble;
    case Precision::bf16: return torch::kBFloat16;
    default: return torch::kFloat;
  }
}

// |actual - expected| <= rtol |expected| + atol max(1, max |expected|), elementwise: atol is
// relative to the largest finite magnitude, since a sum that cancels to near 0 keeps the
// rounding error of its largest terms. NaN and infinities must match exactly.
struct Tolerance {
  double atol, rtol;
};

// fp32: a few ulps of accumulated rounding over the small sums used here; fp64 likewise.
// bf16 (8 significant bits: an ulp is 2^-7 relative): about four ulps, since the fused op and
// LibTorch's unfused ones round intermediate results, which can be larger than the output (a
// matmul before its bias, terms before their sum), at different points; measured differences
// stay below half of that. A wrong result is off by far more, and the bitwise checks are exact.
inline Tolerance default_tolerance(Precision precision) {
  switch (precision) {
    case Precision::fp64: return {1e-12, 1e-12};
    case Precision::fp32: return {2e-6, 2e-6};
    default: return {3e-2, 3e-2};
  }
}

inline ::testing::AssertionResult Close(const torch::Tensor& actual, const torch::Tensor& expected,
                                        const Tolerance& tolerance) {
  const torch::Tensor magnitudes = expected.detach().to(torch::kDouble).abs();
  const torch::Tensor finite = magnitudes.masked_select(magnitudes.isfinite());
  const double largest = finite.numel() == 0 ? 0.0 : finite.max().item<double>();
  return AgreesWithNonFinite(actual, expected, tolerance.atol * std::max(1.0, largest), tolerance.rtol);
}

// For references whose ops promote to fp32 under autocast (a sum onto fp32 zeros, a product with
// an fp32 buffer): their result in the autocast dtype, which the layer they define returns, as
// torch::nn::Linear and Conv2d do.
inline torch::Tensor in_autocast_dtype(const torch::Tensor& t) {
  return at::autocast::is_cpu_enabled() ? t.to(at::autocast::get_autocast_cpu_dtype()) : t;
}

// Whether two tensors' storages overlap anywhere (conservative: whole storages, not just the
// elements each views).
inline bool shares_memory(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.has_storage() || !b.has_storage()) return false;
  const auto* a_begin = static_cast<const char*>(a.storage().data());
  const auto* b_begin = static_cast<const char*>(b.storage().data());
  if (a_begin == nullptr || b_begin == nullptr) return false;
  return a_begin < b_begin + b.storage().nbytes() && b_begin < a_begin + a.storage().nbytes();
}

// Everything one trial of an op reads: random inputs drawn here in a requested layout, and the
// tensors of modules (parameters, buffers) watched as they are. Gradients are taken with
// respect to the watched tensors that require grad (for a laid-out input: the tensor owning its
// memory, of which the input is a view).
class Inputs {
 public:
  Inputs(torch::Dtype dtype, uint64_t seed, Values values = Values::finite)
      : dtype_(dtype), values_(values), generator_(at::detail::createCPUGenerator(seed)) {}

  torch::Dtype dtype() const { return dtype_; }

  // Standard normal values of `sizes` in `layout`, with NaN and infinities among the elements
  // the input shows where the values say so.
  torch::Tensor random(std::vector<int64_t> sizes, Layout layout, bool requires_grad = true) {
    const int64_t dims = static_cast<int64_t>(sizes.size());
    if (layout == Layout::transposed && dims < 2) layout = Layout::strided;
    if (layout == Layout::channels_last && dims != 4) layout = Layout::contiguous;
    if (dims == 0) layout = Layout::contiguous;
    std::vector<int64_t> drawn = sizes;
    int64_t expanded_dim = 0;
    if (layout == Layout::strided) drawn.back() *= 2;
    if (layout == Layout::transposed) std::swap(drawn[dims - 1], drawn[dims - 2]);
    if (layout == Layout::expanded) {
      while (expanded_dim + 1 < dims && sizes[expanded_dim] == 1) ++expanded_dim;
      drawn[expanded_dim] = 1;
    }
    torch::Tensor leaf = torch::randn(drawn, generator_, torch::kFloat).to(dtype_);
    if (layout == Layout::channels_last) leaf = afterburner::channels_last(leaf);  // one channel included
    if (values_ == Values::non_finite) with_non_finite(laid_out(leaf, layout, sizes), generator_);
    leaf.requires_grad_(requires_grad);
    watch(leaf);
    return laid_out(leaf, layout, sizes);
  }

  // Integers uniform in [0, high), e.g. class targets.
  torch::Tensor integers(std::vector<int64_t> sizes, int64_t high) {
    torch::Tensor t = torch::randint(0, high, sizes, generator_, torch::kLong);
    watch(t);
    return t;
  }

  // A tensor the op reads that was not drawn here.
  void watch(const torch::Tensor& tensor) { watched_.push_back(tensor); }
  void watch(const torch::nn::Module& module) {
    for (const auto& p : module.parameters()) watch(p);
    for (const auto& b : module.buffers()) watch(b);
  }

  const std::vector<torch::Tensor>& watched() const { return watched_; }
  std::vector<torch::Tensor> differentiable() const {
    std::vector<torch::Tensor> out;
    for (const auto& t : watched_) {
      if (t.requires_grad()) out.push_back(t);
    }
    return out;
  }

 private:
  static torch::Tensor laid_out(const torch::Tensor& leaf, Layout layout, const std::vector<int64_t>& sizes) {
    switch (layout) {
      case Layout::strided: return leaf.slice(-1, 0, leaf.size(-1), 2);
      case Layout::transposed: return leaf.transpose(-1, -2);
      case Layout::expanded: return leaf.expand(sizes);
      default: return leaf;
    }
  }

  torch::Dtype dtype_;
  Values values_;
  at::Generator generator_;
  std::vector<torch::Tensor> watched_;
};

// The op under test and LibTorch's unfused ops computing the same, on the same inputs.
struct Trial {
  std::function<torch::Tensor()> op;
  std::function<torch::Tensor()> reference;
};

using Shape = std::vector<int64_t>;  // each case says what its numbers mean

struct OpCase {
  std::string name;
  std::vector<Precision> precisions;
  std::vector<Shape> shapes;
  std::vector<Layout> layouts;
  std::function<Trial(Inputs&, const Shape&, Layout)> make;
  // Per precision; unset: default_tolerance.
  std::function<Tolerance(Precision)> tolerance = {};
  // Whether a call without grad mode runs the same code, and so must give the same bits; if not,
  // it must agree within the tolerance.
  bool same_path_without_grad = true;
  // The precisions in which the gradients are differentiated too: the gradient of
  // sum(w_i . dL/dv_i) over the differentiable inputs v_i, for fixed random w_i.
  std::vector<Precision> second_order = {};
  // What the drawn inputs hold: every case runs on NaN and infinities too unless it says why not.
  std::vector<Values> values = {Values::finite, Values::non_finite};
};

inline void PrintTo(const OpCase& c, std::ostream* out) { *out << c.name; }

// The case, with its second-order gradients checked too, in all its precisions or in those given.
inline OpCase differentiated_twice(OpCase c, std::vector<Precision> precisions = {}) {
  c.second_order = precisions.empty() ? c.precisions : std::move(precisions);
  return c;
}

// One forward and, when it is differentiable, one backward with a fixed upstream gradient; with
// second order, the second-order gradients follow the first-order ones in `grads`.
struct Run {
  torch::Tensor output;
  std::vector<torch::Tensor> grads;
};

inline torch::Tensor seeded_normal(torch::IntArrayRef sizes, torch::Dtype dtype, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return torch::randn(sizes, generator, torch::kFloat).to(dtype);
}

// d/dv_i sum_j (w_j . grads_j) for fixed random w_j, where grads (built with create_graph) are
// the gradients with respect to `differentiable`.
inline std::vector<torch::Tensor> second_order_gradients(const std::vector<torch::Tensor>& grads,
                                                         const std::vector<torch::Tensor>& differentiable,
                                                         uint64_t seed) {
  torch::Tensor weighted_sum = torch::zeros({}, torch::kDouble);
  for (size_t j = 0; j < grads.size(); ++j) {
    if (grads[j].defined() && grads[j].requires_grad()) {
      const torch::Tensor weights = seeded_normal(grads[j].sizes(), grads[j].scalar_type(), seed + j);
      weighted_sum = weighted_sum + (grads[j] * weights).sum();
    }
  }
  std::vector<torch::Tensor> second(differentiable.size());
  if (weighted_sum.requires_grad()) {
    second = torch::autograd::grad({weighted_sum}, differentiable, {}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
  }
  for (size_t i = 0; i < second.size(); ++i) {
    // An input the gradients do not depend on: autograd says undefined or zeros, depending on the
    // formulas on the way; both mean 0.
    if (!second[i].defined()) second[i] = torch::zeros_like(differentiable[i]);
  }
  return second;
}

inline Run run_once(const std::function<torch::Tensor()>& f, Precision precision, const Inputs& inputs,
                    uint64_t upstream_seed, bool second_order = false) {
  Run run;
  {
    std::optional<BFloat16Autocast> autocast;
    if (precision == Precision::autocast_bf16) autocast.emplace();
    run.output = f();
  }
  const std::vector<torch::Tensor> differentiable = inputs.differentiable();
  if (differentiable.empty() || !run.output.requires_grad()) return run;
  const torch::Tensor upstream = seeded_normal(run.output.sizes(), run.output.scalar_type(), upstream_seed);
  run.grads = torch::autograd::grad({run.output}, differentiable, {upstream}, /*retain_graph=*/second_order,
                                    /*create_graph=*/second_order, /*allow_unused=*/true);
  if (!second_order) return run;
  const std::vector<torch::Tensor> second = second_order_gradients(run.grads, differentiable, upstream_seed + 1);
  for (auto& g : run.grads) g = g.defined() ? g.detach() : g;
  run.grads.insert(run.grads.end(), second.begin(), second.end());
  return run;
}

inline std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& t : tensors) copies.push_back(t.detach().clone());
  return copies;
}

inline void expect_unchanged(const std::vector<torch::Tensor>& tensors, const std::vector<torch::Tensor>& before,
                             const char* when) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(tensors[i], before[i])) << "input or parameter " << i << " changed " << when;
  }
}

inline void expect_own_memory(const Run& run, const std::vector<torch::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_FALSE(shares_memory(run.output, tensors[i])) << "the output shares memory with input or parameter " << i;
    for (size_t g = 0; g < run.grads.size(); ++g) {
      EXPECT_FALSE(shares_memory(run.grads[g], tensors[i]))
          << "gradient " << g << " shares memory with input or parameter " << i;
    }
  }
}

inline void expect_bitwise_equal(const Run& a, const Run& b, const char* what) {
  EXPECT_TRUE(BitwiseEqual(a.output, b.output)) << "outputs differ: " << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t g = 0; g < a.grads.size(); ++g) {
    EXPECT_EQ(a.grads[g].defined(), b.grads[g].defined());
    if (a.grads[g].defined() && b.grads[g].defined()) {
      EXPECT_TRUE(BitwiseEqual(a.grads[g], b.grads[g])) << "gradient " << g << " differs: " << what;
    }
  }
}

inline void expect_contract(const OpCase& c, Precision precision, const Shape& shape, Layout layout, Values values) {
  constexpr uint64_t kInputSeed = 17, kUpstreamSeed = 29;
  const bool second_order =
      std::find(c.second_order.begin(), c.second_order.end(), precision) != c.second_order.end();
  torch::manual_seed(kInputSeed);  // module initialisation in `make`
  Inputs inputs(tensor_dtype(precision), kInputSeed, values);
  const Trial trial = c.make(inputs, shape, layout);
  const std::vector<torch::Tensor> before = snapshot(inputs.watched());

  const Run first = run_once(trial.op, precision, inputs, kUpstreamSeed, second_order);
  expect_unchanged(inputs.watched(), before, "by the first call");
  expect_own_memory(first, inputs.watched());
  const Run second = run_once(trial.op, precision, inputs, kUpstreamSeed, second_order);
  expect_unchanged(inputs.watched(), before, "by the second call");
  expect_bitwise_equal(first, second, "second call");
  const Tolerance tolerance = c.tolerance ? c.tolerance(precision) : default_tolerance(precision);
  {
    torch::NoGradGuard no_grad;
    const Run without_grad = run_once(trial.op, precision, inputs, kUpstreamSeed);
    EXPECT_TRUE(c.same_path_without_grad ? BitwiseEqual(without_grad.output, first.output)
                                         : Close(without_grad.output, first.output, tolerance))
        << "output differs without grad mode";
    expect_unchanged(inputs.watched(), before, "by a call without grad mode");
    expect_own_memory(without_grad, inputs.watched());
  }

  const Run expected = run_once(trial.reference, precision, inputs, kUpstreamSeed, second_order);
  EXPECT_EQ(first.output.scalar_type(), expected.output.scalar_type());
  EXPECT_TRUE(Close(first.output, expected.output, tolerance)) << "output";
  ASSERT_EQ(first.grads.size(), expected.grads.size());
  for (size_t g = 0; g < first.grads.size(); ++g) {
    ASSERT_EQ(first.grads[g].defined(), expected.grads[g].defined()) << "gradient " << g;
    if (!first.grads[g].defined()) continue;
    EXPECT_EQ(first.grads[g].scalar_type(), expected.grads[g].scalar_type()) << "gradient " << g;
    EXPECT_TRUE(Close(first.grads[g], expected.grads[g], tolerance)) << "gradient " << g;
  }
}

// Every precision x shape x layout x values of the case.
inline void expect_kernel_contract(const OpCase& c) {
  for (const Values values : c.values) {
    for (const Precision precision : c.precisions) {
      for (const Shape& shape : c.shapes) {
        for (const Layout layout : c.layouts) {
          SCOPED_TRACE(::testing::Message() << c.name << ", " << to_string(precision) << ", shape "
                                            << c10::IntArrayRef(shape) << ", " << to_string(layout) << ", "
                                            << to_string(values));
          try {
            expect_contract(c, precision, shape, layout, values);
          } catch (const std::exception& e) {  // reported with the trace, and the other variants still run
            const std::string what = e.what();
            ADD_FAILURE() << "threw: " << what.substr(0, what.find('\n'));
          }
        }
      }
    }
  }
}

}  // namespace afterburner::testing
