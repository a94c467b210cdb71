#include "afterburner/kernels/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "dropout_noise.h"

namespace afterburner::kernels {
namespace {

constexpr int kStateSize = at::MERSENNE_STATE_N, kShift = at::MERSENNE_STATE_M;
// Elements drawn per pass: their draws (64 KB) stay in L2 between drawing and comparing.
constexpr int64_t kElementsPerPass = 8192;

// at::mt19937's next_state over the whole state: element i becomes s[i + 397] ^ twist(s[i],
// s[i + 1]), indices modulo 624, in order, so the elements from 227 on read ones this pass
// already rewrote. Each loop reads only elements at least 227 away or not yet rewritten, so the
// compiler vectorises them.
inline uint32_t twisted(uint32_t u, uint32_t v) {
  return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ (v & 1u ? 0x9908b0dfu : 0u);
}

inline void next_state(uint32_t* s) {
  for (int i = 0; i < kStateSize - kShift; ++i) s[i] = s[i + kShift] ^ twisted(s[i], s[i + 1]);
  for (int i = kStateSize - kShift; i < kStateSize - 1; ++i) s[i] = s[i + kShift - kStateSize] ^ twisted(s[i], s[i + 1]);
  s[kStateSize - 1] = s[kShift - 1] ^ twisted(s[kStateSize - 1], s[0]);
}

// The next `count` outputs of the engine whose state is `e`, as `count` calls of
// at::mt19937::operator() return them, leaving e as they leave it. A call takes the element at
// next_ after counting left_ down, and twists the state first when left_ reaches 0; so left_ - 1
// elements can be taken before a twist, and after one there are 624.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void draw(at::mt19937_data_pod& e,
                                                                               uint32_t* out, int64_t count) {
  uint32_t* state = e.state_.data();
  while (count > 0) {
    if (e.left_ == 1) {
      next_state(state);
      e.left_ = kStateSize + 1;
      e.next_ = 0;
    }
    const int64_t taken = std::min<int64_t>(count, e.left_ - 1);
    const uint32_t* from = state + e.next_;
    for (int64_t i = 0; i < taken; ++i) {  // tempered, as operator() returns them
      uint32_t y = from[i];
      y ^= y >> 11;
      y ^= (y << 7) & 0x9d2c5680u;
      y ^= (y << 15) & 0xefc60000u;
      out[i] = y ^ (y >> 18);
    }
    e.next_ += static_cast<uint32_t>(taken);
    e.left_ -= static_cast<int>(taken);
    out += taken;
    count -= taken;
  }
}

// noise[i] = kept where u_i < keep, else 0, as raw bits of the noise's dtype. LibTorch's
// bernoulli_distribution<double>(keep) takes u = m / 2^53, m the low 53 bits of (first draw << 32 |
// second draw): exactly, u < keep where the integer m < `threshold` = ceil(keep * 2^53).
template <typename Bits>
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void keep_where_below(
    const uint32_t* draws, int64_t count, uint64_t threshold, Bits kept, Bits* noise) {
  constexpr uint64_t kMantissa = (uint64_t{1} << 53) - 1;
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t m = ((uint64_t{draws[2 * i]} << 32) | draws[2 * i + 1]) & kMantissa;
    noise[i] = m < threshold ? kept : Bits{0};
  }
}

// out[i] = kept where bernoulli_(keep) keeps element i, else 0, for `count` elements drawn from
// `engine` as that call draws them.
template <typename Bits>
void fill_kept(Bits* out, int64_t count, double keep, Bits kept, at::mt19937_data_pod& engine) {
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(std::ldexp(keep, 53)));
  std::vector<uint32_t> draws(2 * std::min(count, kElementsPerPass));
  for (int64_t start = 0; start < count; start += kElementsPerPass) {
    const int64_t n = std::min(kElementsPerPass, count - start);
    draw(engine, draws.data(), 2 * n);
    keep_where_below(draws.data(), n, threshold, kept, out + start);
  }
}

// fill(engine) on the default CPU generator's engine, under its lock, leaving the generator where
// the draws leave it.
template <typename Fill>
void draw_from_default_generator(const Fill& fill) {
  auto* generator = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  const std::lock_guard<std::mutex> lock(generator->mutex_);
  at::mt19937_data_pod engine = generator->engine().data();
  fill(engine);
  at::mt19937 advanced;
  advanced.set_data(engine);
  generator->set_engine(advanced);
}

// `noise` (contiguous; Bits of its element size) filled as noise.bernoulli_(keep).div_(keep)
// fills it: 1 / keep where kept, as div_ computes it, else 0.
template <typename Bits>
void fill_noise(torch::Tensor& noise, double keep, at::mt19937_data_pod& engine) {
  const torch::Tensor one = dropout_kept_value(noise.scalar_type(), keep);
  Bits kept;
  std::memcpy(&kept, one.data_ptr(), sizeof kept);
  fill_kept(static_cast<Bits*>(noise.data_ptr()), noise.numel(), keep, kept, engine);
}

// noise.bernoulli_(keep).div_(keep) from the default CPU generator, which is left where
// bernoulli_ leaves it.
void noise_from_default_generator(torch::Tensor& noise, double keep) {
  draw_from_default_generator([&](at::mt19937_data_pod& engine) {
    switch (noise.element_size()) {
      case 2: fill_noise<uint16_t>(noise, keep, engine); break;
      case 4: fill_noise<uint32_t>(noise, keep, engine); break;
      default: fill_noise<uint64_t>(noise, keep, engine);
    }
  });
}

bool drawn_here(const torch::Tensor& x, double p, bool train) {
  const auto dtype = x.scalar_type();
  return train && p > 0 && p < 1 && x.numel() > 0 && x.device().is_cpu() && x.layout() == at::kStrided &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

}  // namespace

torch::Tensor dropout_kept_value(at::ScalarType dtype, double keep) {
  return at::ones({1}, at::TensorOptions().dtype(dtype)).div_(keep);
}

torch::Tensor dropout_keep_flags(at::IntArrayRef sizes, double keep) {
  torch::Tensor flags = at::empty(sizes, at::kByte);
  draw_from_default_generator([&](at::mt19937_data_pod& engine) {
    fill_kept<uint8_t>(flags.data_ptr<uint8_t>(), flags.numel(), keep, 1, engine);
  });
  return flags;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool train) {
  if (!drawn_here(x, p, train)) return at::dropout(x, p, train);
  torch::Tensor noise = at::empty_like(x, at::MemoryFormat::Contiguous);
  {
    const at::NoGradGuard no_grad;
    noise_from_default_generator(noise, 1 - p);
  }
  return x.mul(noise);
}

}  // namespace afterburner::kernels
