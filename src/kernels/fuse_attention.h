// The rewrite of nn.MultiheadAttention onto afterburner::attention, a step of fuse_forward's.
#pragma once

#include <torch/csrc/jit/ir/ir.h>

#include <string>
#include <vector>

namespace afterburner::kernels {

struct AttentionRewrite {
  int fused = 0;                      // calls rewritten
  std::vector<std::string> notices;   // one per call left as it was, with the reason

  AttentionRewrite& operator+=(const AttentionRewrite& other) {
    fused += other.fused;
    notices.insert(notices.end(), other.notices.begin(), other.notices.end());
    return *this;
  }
};

// Each call in `block` (and the blocks inside it, not its callees) of the forward of a scripted
// nn.MultiheadAttention becomes `if <a case the fused op does not compute as MHA does>: <MHA's
// forward, inlined> else: <in-projection, afterburner::attention, out_proj>` (dropout of the
// weights in training from the same draws as MHA's). The cases left to MHA are decided when the
// graph runs: add_zero_attn, bias_k/bias_v, unbatched inputs, shapes and masks MHA refuses or
// reads otherwise (so its errors stay its own).
// Modules with separate q/k/v projection weights, and forwards of other signatures, are left as
// they are, with a notice. Calls of nn.TransformerEncoderLayer's and nn.TransformerEncoder's
// forwards are inlined without their fast path for evaluation, which fails under CPU autocast in
// LibTorch 1.13 (as MHA's inlined forward is).
AttentionRewrite rewrite_attention_calls(torch::jit::Block* block);

}  // namespace afterburner::kernels
