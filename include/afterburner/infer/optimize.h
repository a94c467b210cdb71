// Rewrites a TorchScript model for CPU inference: freeze, remove dropout, fold BatchNorm into
// the convolutions before it, and optionally bf16 or int8. The result saves and loads anywhere
// (torch::jit::load, Python's torch.jit.load). oneDNN's layouts (optimize_for_inference) are
// applied after loading, in memory: LibTorch 1.13 cannot load a file holding oneDNN constants.
//
//   namespace infer = afterburner::infer;
//   auto result = infer::optimize(infer::load_model("cnn.pt"),
//                                 infer::OptimizeOptions().precision(infer::Precision::bf16));
//   for (const auto& pass : result.passes) std::cout << pass << "\n";
//   infer::save_model(result.model, "cnn-opt.pt");
//   auto fast = infer::load_optimized("cnn-opt.pt");   // what a server runs
#pragma once

#include <torch/arg.h>
#include <torch/csrc/jit/api/module.h>

#include <string>
#include <vector>

#include "afterburner/infer/verify.h"

namespace afterburner::infer {

enum class Precision { fp32, bf16, int8 };

// "fp32", "bf16" or "int8"; anything else throws UsageError("precision", ...).
Precision parse_precision(const std::string& name);
std::string to_string(Precision precision);

// What verification holds a model optimized at `precision` to by default: fp32 must match to
// float rounding (1e-3, plus 1e-4 of the outputs' scale: EfficientNet-B0's logits in the
// thousands moved by 5.6e-6 of it, as under Python's own torch.jit.freeze); bf16 and int8 round
// every layer, so their logits move more (0.5 + 5% of the scale: Python's own bf16 autocast
// moved that EfficientNet's by 4.9%; int8 1 + 5%) while the predicted class must stay (99.5%
// and 99% top-1 agreement).
Tolerance default_tolerance(Precision precision);

struct OptimizeOptions {
  // fp32: exact up to float reassociation. bf16: weights and activations in bfloat16 (images
  // and convolution weights channels-last), the model still takes and returns float32. int8:
  // Linear layers quantized dynamically (weights int8 per output channel, activations quantized
  // per call), the rest stays fp32; selects the oneDNN quantized engine for the whole process
  // (LibTorch's default where FBGEMM is absent, as in Debian's build).
  TORCH_ARG(Precision, precision) = Precision::fp32;
};

struct OptimizeResult {
  torch::jit::Module model;
  std::vector<std::string> passes;  // one line per pass, saying what it changed
};

// The input is not modified. Throws Error if the model has no forward method.
OptimizeResult optimize(const torch::jit::Module& model, const OptimizeOptions& options = {});

// torch::jit::optimize_for_inference on a copy of an optimized (frozen) model: convolutions on
// oneDNN's blocked layout with prepacked weights, linear weights pre-transposed, then fp32 linear
// layers routed to oneDNN's GEMM (onednn_linear.h), MultiheadAttention's and
// TransformerEncoderLayer's fast paths and MultiheadAttention's composed attention onto our
// kernels (attention_fast_paths.h), 3x3 convolutions by Winograd where it pays (winograd_conv.h),
// the oneDNN ops that would drop NaN or infinities rewritten (non_finite.h) and DenseNet's
// concatenations into growing buffers (channel_concat.h). Same outputs up to float rounding, NaN
// and infinities where LibTorch's ops put them; the result cannot be saved.
torch::jit::Module prepare_for_inference(const torch::jit::Module& optimized);

// load_model then prepare_for_inference. Throws ModelError naming the file.
torch::jit::Module load_optimized(const std::string& path);

}  // namespace afterburner::infer
