// Forward+backward time of kernels::attention against the core of torch::nn::MultiheadAttention
// as LibTorch 1.13 runs it (F::multi_head_attention_forward: q scaled, bmm(q, k^T), softmax,
// bmm(., v), autograd through them), on the same q, k, v [B, H, L, D] (the reference reads them
// as [B * H, L, D] views, as MultiheadAttention holds them), at sequence 256 and 1,024, fp32 and
// under bf16 autocast (entered and left every step, as training does), without a mask and
// causal (the reference adding the causal mask with baddbmm, as MultiheadAttention adds its
// attn_mask). Each pair alternates after a warm-up: median [min, max] and the ratio.
//
// --gemm-blocks times the kernel's block GEMMs (the shapes one query block meets at D = 64) on
// one thread, oneDNN's sgemm against at::mm_out into a preallocated block: the choice the kernel
// makes.
//
//   bench_attention [--reps N] [--threads N] [--batch N] [--heads N] [--dim N] [--lengths 256,1024] [--gemm-blocks]
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "afterburner/core/blas.h"
#include "afterburner/core/error.h"
#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/kernels/attention.h"
#include "afterburner/profile/alternate.h"
#include "afterburner/train/precision.h"

namespace {

using afterburner::train::Precision;

struct Settings {
  int reps = 5;
  int threads = 2;
  int64_t batch = 4, heads = 8, dim = 64;
  std::vector<int64_t> lengths{256, 1024};
  bool gemm_blocks = false;
};

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');) values.push_back(std::max<int64_t>(1, std::atoll(item.c_str())));
  return values;
}

Settings parse(int argc, char** argv) {
  Settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--gemm-blocks") {
      s.gemm_blocks = true;
      continue;
    }
    if (i + 1 >= argc) throw afterburner::UsageError(flag, "needs a value");
    const std::string value = argv[++i];
    const int64_t number = std::max<int64_t>(1, std::atoll(value.c_str()));
    if (flag == "--reps") s.reps = static_cast<int>(number);
    else if (flag == "--threads") s.threads = static_cast<int>(number);
    else if (flag == "--batch") s.batch = number;
    else if (flag == "--heads") s.heads = number;
    else if (flag == "--dim") s.dim = number;
    else if (flag == "--lengths") s.lengths = parse_list(value);
    else throw afterburner::UsageError(flag, "unknown flag (use --reps, --threads, --batch, --heads, --dim, --lengths, --gemm-blocks)");
  }
  return s;
}

void compare(const std::string& label, const std::function<void()>& ours, const std::function<void()>& theirs,
             int reps) {
  const auto [a, b] = afterburner::profile::time_alternately(ours, theirs, reps, 2);
  std::printf("%-40s fused %9.2f ms [%9.2f, %9.2f]  MHA core %9.2f ms [%9.2f, %9.2f]  ratio %.2fx\n", label.c_str(),
              a.median, a.min, a.max, b.median, b.min, b.max, b.median / a.median);
  std::fflush(stdout);
}

using Forward = std::function<torch::Tensor()>;

std::function<void()> forward_backward(const Forward& forward, const std::vector<torch::Tensor>& inputs,
                                       const torch::Tensor& upstream, Precision precision) {
  return [=] {
    torch::Tensor output;
    {
      afterburner::train::AutocastGuard autocast(precision);
      output = forward();
    }
    torch::autograd::grad({output}, inputs, {upstream.to(output.scalar_type())});
  };
}

// MultiheadAttention's core in LibTorch 1.13 (torch/nn/functional/activation.h): q scaled by
// 1/sqrt(D), baddbmm with the additive mask (bmm without one), softmax, bmm with v.
torch::Tensor multihead_attention_core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& additive_mask) {
  const torch::Tensor scaled = q * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const torch::Tensor scores = additive_mask.defined() ? torch::baddbmm(additive_mask, scaled, k.transpose(1, 2))
                                                       : torch::bmm(scaled, k.transpose(1, 2));
  return torch::bmm(torch::softmax(scores, -1), v);
}

void bench_length(const Settings& s, int64_t length, bool causal, Precision precision) {
  const auto requiring_grad = [&] { return torch::randn({s.batch, s.heads, length, s.dim}).requires_grad_(); };
  const torch::Tensor q = requiring_grad(), k = requiring_grad(), v = requiring_grad();
  const torch::Tensor upstream = torch::randn({s.batch, s.heads, length, s.dim});
  const std::vector<int64_t> flat{s.batch * s.heads, length, s.dim};
  torch::Tensor additive;
  if (causal) {
    additive = torch::zeros({length, length}).masked_fill_(torch::ones({length, length}, torch::kBool).triu(1), -INFINITY);
  }
  const Forward fused = [=] { return afterburner::kernels::attention(q, k, v, c10::nullopt, causal); };
  const Forward reference = [=] {
    return multihead_attention_core(q.view(flat), k.view(flat), v.view(flat), additive).view(q.sizes());
  };
  const std::string label = "L " + std::to_string(length) + (causal ? " causal " : " ") +
                            afterburner::train::to_string(precision);
  compare(label, forward_backward(fused, {q, k, v}, upstream, precision),
          forward_backward(reference, {q, k, v}, upstream, precision), s.reps);
}

// The block GEMMs of one query block against one key block at D = 64 (64 query rows, 128 key
// rows): scores q k^T [64 x 128, K 64], then p v [64 x 64, K 128], on one thread.
void bench_gemm_blocks(int reps) {
  afterburner::ThreadsGuard one(1);
  const torch::Tensor q = torch::randn({64, 64}), k = torch::randn({128, 64}), v = torch::randn({128, 64});
  torch::Tensor scores = torch::empty({64, 128}), out = torch::zeros({64, 64});
  constexpr int kCalls = 2000;
  const auto onednn = [&] {
    for (int i = 0; i < kCalls; ++i) {
      dnnl_sgemm('N', 'T', 64, 128, 64, 1.0f, q.data_ptr<float>(), 64, k.data_ptr<float>(), 64, 0.0f,
                 scores.data_ptr<float>(), 128);
      dnnl_sgemm('N', 'N', 64, 64, 128, 1.0f, scores.data_ptr<float>(), 128, v.data_ptr<float>(), 64, 1.0f,
                 out.data_ptr<float>(), 64);
    }
  };
  const auto aten = [&] {
    for (int i = 0; i < kCalls; ++i) {
      at::mm_out(scores, q, k.t());
      at::addmm_out(out, out, scores, v);
    }
  };
  const auto [a, b] = afterburner::profile::time_alternately(onednn, aten, reps, 2);
  const double flops = 2.0 * kCalls * (64 * 128 * 64 + 64 * 64 * 128);
  std::printf("block GEMMs x%d, 1 thread: oneDNN sgemm %.2f ms (%.1f GFLOPS) [%.2f, %.2f]  at::mm_out/addmm_out %.2f ms "
              "(%.1f GFLOPS) [%.2f, %.2f]\n",
              kCalls, a.median, flops / a.median / 1e6, a.min, a.max, b.median, flops / b.median / 1e6, b.min, b.max);
}

}  // namespace

int main(int argc, char** argv) try {
  const Settings s = parse(argc, argv);
  afterburner::ThreadsGuard threads(s.threads);
  afterburner::keep_freed_memory();
  torch::manual_seed(0);
  const afterburner::BlasInfo blas = afterburner::detect_blas();
  std::printf("attention forward+backward, B %lld, H %lld, D %lld, %d threads, %d reps, BLAS %s; median [min, max]\n",
              static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.dim), s.threads,
              s.reps, blas.name.c_str());
  if (s.gemm_blocks) bench_gemm_blocks(s.reps);
  for (const Precision precision : {Precision::fp32, Precision::bf16}) {
    for (const int64_t length : s.lengths) {
      for (const bool causal : {false, true}) bench_length(s, length, causal, precision);
    }
  }
  return 0;
} catch (const afterburner::Error& e) {
  std::fprintf(stderr, "bench_attention: %s\n", e.what());
  return e.exit_code();
}
