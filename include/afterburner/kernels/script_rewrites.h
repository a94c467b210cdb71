// What the TorchScript rewrites of fuse_forward (kernels: fused attention) and sketch_script
// (sketch: random-feature attention) share: torch.nn's modules recognised, their fast paths
// removed, and TorchScript source that calls afterburner's ops.
//
//   const auto type = module.type();
//   if (is_torch_nn(type, "MultiheadAttention") && why_not_rewritable_attention(type).empty()) rewrite(module);
//   module.define("def forward(self, x):\n    return afterburner.gelu(x)\n", resolver_with_afterburner_ops());
#pragma once

#include <ATen/core/jit_type.h>
#include <torch/csrc/jit/frontend/resolver.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>

namespace afterburner::kernels {

// `type` is torch.nn's class `name` (e.g. "MultiheadAttention"), scripted.
bool is_torch_nn(const c10::ClassTypePtr& type, const char* name);

// Why calls of a scripted nn.MultiheadAttention's forward cannot be rewritten; empty if they can:
// LibTorch 1.13's forward signature (not a trace's), the projections packed in in_proj_weight,
// out_proj a Linear, and the attributes its forward reads.
std::string why_not_rewritable_attention(const c10::ClassTypePtr& type);

// The evaluation fast paths of nn.TransformerEncoderLayer's and nn.TransformerEncoder's forward
// (one native op over the attention's packed weights; nested tensors) removed from `graph`, the
// path they train with kept: after it, their forwards read their self_attn only to call it and to
// read attributes of its configuration (num_heads, _qkv_same_embed_dim) into their dead checks.
// Returns how many fast paths were removed.
int remove_transformer_fast_paths(const std::shared_ptr<torch::jit::Graph>& graph);

// LibTorch's native resolver, with afterburner's ops beside aten's (which it names torch): source
// compiled with it calls them as `afterburner.<op>(...)`.
std::shared_ptr<torch::jit::Resolver> resolver_with_afterburner_ops();

}  // namespace afterburner::kernels
