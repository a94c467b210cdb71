// afterburner::self_attention and afterburner::encoder_layer, as prepare_for_inference's
// route_attention_fast_paths_to_ours puts them in place of MultiheadAttention's and
// TransformerEncoderLayer's fast paths (aten::_native_multi_head_attention,
// aten::_transformer_encoder_layer_fwd): against the layers computed in double from their
// definitions, at batch 1, 2, 7 and 64, 1, 5 and 197 tokens (one side of the attention kernel's
// 128-key switch and the other), even and odd head counts, post- and pre-norm, ReLU and GELU, fp32
// and bf16; twice the same; inputs untouched; NaN and infinities where the native ops put them;
// calls with a mask or reading the weights run by the native ops, cross-attention not rewritten,
// and inputs they do not take handed to the native ops. And fuse_composed_attention: the
// bmm-softmax-bmm of MultiheadAttention's composed forward on the fused kernel, other compositions
// left alone.
#include "afterburner/infer/attention_fast_paths.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/script.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "afterburner/infer/optimize.h"
#include "non_finite.h"

namespace afterburner::infer::attention_fast_paths_test {
namespace {
namespace jit = torch::jit;
using testing::BitwiseEqual;

struct Shape {
  int64_t embed, heads;
};

using Weights = AttentionWeights;

Weights random_weights(const Shape& s, torch::Dtype dtype = torch::kFloat) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.embed));
  return {(torch::randn({3 * s.embed, s.embed}) * scale).to(dtype), (torch::randn({3 * s.embed}) * 0.1).to(dtype),
          (torch::randn({s.embed, s.embed}) * scale).to(dtype), (torch::randn({s.embed}) * 0.1).to(dtype)};
}

// A module in eval mode whose forward is MultiheadAttention's fast-path call r with `arguments`
// after the weights (mask, need_weights), on x (and y where the source names it), returning
// `returned` (its answer, r[0], unless told).
jit::Module native_call(const Shape& s, const Weights& w, const std::string& query_key_value,
                        const std::string& arguments, const std::string& parameters = "x",
                        const std::string& returned = "r[0]") {
  jit::Module module("__torch__.FastPath");
  module.register_parameter("w", w.qkv_weight, false);
  module.register_parameter("b", w.qkv_bias, false);
  module.register_parameter("wo", w.proj_weight, false);
  module.register_parameter("bo", w.proj_bias, false);
  module.define(
      fmt::format("def forward(self, {}):\n"
                  "    r = torch._native_multi_head_attention({}, {}, {}, self.w, self.b, self.wo, self.bo, {})\n"
                  "    return {}\n",
                  parameters, query_key_value, s.embed, s.heads, arguments, returned));
  module.eval();
  return module;
}

jit::Module self_attention_module(const Shape& s, const Weights& w) {
  return native_call(s, w, "x, x, x", "None, False");
}

int count_kind(const jit::Module& module, const char* kind) {
  int count = 0;
  const auto graph = jit::Module(module).get_method("forward").graph();
  for (const jit::Node* node : graph->nodes()) count += node->kind() == c10::Symbol::fromQualString(kind);
  return count;
}

// How many times LibTorch's fast-path ops ran (on this thread) during `action`: none when ours
// compute the call, whose answers the native op's could otherwise pass for.
int native_calls(const std::function<void()>& action) {
  static thread_local int calls = 0;
  calls = 0;
  const auto count = [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
    const std::string name = fn.name();
    calls += name == "aten::_native_multi_head_attention" || name == "aten::_transformer_encoder_layer_fwd";
    return nullptr;
  };
  const at::CallbackHandle handle = at::addThreadLocalCallback(at::RecordFunctionCallback(count));
  action();
  at::removeCallback(handle);
  return calls;
}

// softmax(q_h k_h^T / sqrt(D)) v_h per head, heads joined, projected: in double from the definition.
torch::Tensor reference(const torch::Tensor& x, const Shape& s, const Weights& w) {
  const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const int64_t batch = x.size(0), length = x.size(1), head_dim = s.embed / s.heads;
  const std::vector<torch::Tensor> qkv = torch::linear(d(x), d(w.qkv_weight), d(w.qkv_bias)).chunk(3, -1);
  const auto heads = [&](const torch::Tensor& t) {
    return t.reshape({batch, length, s.heads, head_dim}).transpose(1, 2);
  };
  const torch::Tensor scores = heads(qkv[0]).matmul(heads(qkv[1]).transpose(-2, -1)) / std::sqrt(double(head_dim));
  const torch::Tensor joined =
      scores.softmax(-1).matmul(heads(qkv[2])).transpose(1, 2).reshape({batch, length, s.embed});
  return torch::linear(joined, d(w.proj_weight), d(w.proj_bias));
}

double error_to_scale(const torch::Tensor& y, const torch::Tensor& exact) {
  return ((y.to(torch::kDouble) - exact).abs().max() / exact.abs().max()).item<double>();
}

torch::Tensor answer(jit::Module& module, const std::vector<torch::IValue>& inputs) {
  const torch::NoGradGuard no_grad;
  return module.forward(inputs).toTensor();
}

const std::vector<Shape> kShapes{{32, 4}, {24, 3}, {64, 8}};

// fp32: each projection and the attention sum in another order than the double answer (oneDNN's
// GEMMs, the online softmax): measured up to 6 epsilons of the outputs' scale over these shapes
// (LibTorch's own native op up to 5), bounded at 64.
TEST(SelfAttention, FastPathRoutedOntoOursWithinFloatRoundingTwiceTheSame) {
  const double bound = 64 * std::numeric_limits<float>::epsilon();
  for (const Shape& s : kShapes) {
    torch::manual_seed(s.embed + s.heads);
    const Weights w = random_weights(s);
    jit::Module native = self_attention_module(s, w);
    jit::Module prepared = prepare_for_inference(native);
    ASSERT_EQ(count_kind(prepared, "afterburner::self_attention"), 1)
        << s.embed << " features, " << s.heads << " heads";
    ASSERT_EQ(count_kind(prepared, "aten::_native_multi_head_attention"), 0);
    for (const int64_t batch : {1, 2, 7, 64}) {
      for (const int64_t length : {1, 5, 197}) {
        const std::string what =
            fmt::format("{} features, {} heads, batch {}, {} tokens", s.embed, s.heads, batch, length);
        const torch::Tensor x = torch::randn({batch, length, s.embed});
        const torch::Tensor before = x.clone();
        const torch::Tensor exact = reference(x, s, w);
        torch::Tensor first;
        EXPECT_EQ(native_calls([&] { first = answer(prepared, {x}); }), 0) << what;
        EXPECT_EQ(first.sizes(), x.sizes()) << what;
        EXPECT_LE(error_to_scale(first, exact), bound) << what;
        EXPECT_LE(error_to_scale(answer(native, {x}), exact), bound) << what << ": LibTorch's own";
        EXPECT_TRUE(BitwiseEqual(answer(prepared, {x}), first)) << what << ": a second call answered otherwise";
        EXPECT_TRUE(BitwiseEqual(x, before)) << what << ": the input moved";
      }
    }
  }
}

// bf16 rounds the input, the weights, both projections' outputs and the probabilities to 8
// significant bits: measured up to 1.6e-2 of the scale of the double answer on the bf16 values
// (LibTorch's native op in bf16 up to 2.1e-2), bounded at 3e-2.
TEST(SelfAttention, Bf16WithinItsRoundings) {
  const Shape s{32, 4};
  torch::manual_seed(7);
  const Weights w = random_weights(s, torch::kBFloat16);
  jit::Module native = self_attention_module(s, w);
  jit::Module prepared = prepare_for_inference(native);
  ASSERT_EQ(count_kind(prepared, "afterburner::self_attention"), 1);
  for (const int64_t length : {5, 197}) {
    const torch::Tensor x = torch::randn({3, length, s.embed}).to(torch::kBFloat16);
    const torch::Tensor exact = reference(x, s, w);
    torch::Tensor ours;
    EXPECT_EQ(native_calls([&] { ours = answer(prepared, {x}); }), 0) << length << " tokens";
    EXPECT_EQ(ours.scalar_type(), torch::kBFloat16);
    EXPECT_LE(error_to_scale(ours, exact), 3e-2) << length << " tokens";
    EXPECT_LE(error_to_scale(answer(native, {x}), exact), 3e-2) << length << " tokens: LibTorch's own";
    EXPECT_TRUE(BitwiseEqual(answer(prepared, {x}), ours));
  }
}

// A NaN, +inf or -inf in one token reaches every token of its sample through the keys, as the
// native op spreads it; samples without one stay finite.
TEST(SelfAttention, NonFiniteValuesWhereTheNativeOpPutsThem) {
  const Shape s{32, 4};
  torch::manual_seed(3);
  const Weights w = random_weights(s);
  jit::Module native = self_attention_module(s, w);
  jit::Module prepared = prepare_for_inference(native);
  for (const int64_t length : {5, 197}) {
    torch::Tensor x = torch::randn({4, length, s.embed});
    x.index_put_({0, 0, 0}, std::numeric_limits<float>::quiet_NaN());
    x.index_put_({1, length - 1, 3}, std::numeric_limits<float>::infinity());
    x.index_put_({2, length / 2, s.embed - 1}, -std::numeric_limits<float>::infinity());
    const torch::Tensor ours = answer(prepared, {x}), theirs = answer(native, {x});
    EXPECT_TRUE(torch::equal(ours.isnan(), theirs.isnan())) << length << " tokens";
    EXPECT_TRUE(torch::equal(ours.isinf(), theirs.isinf())) << length << " tokens";
    EXPECT_TRUE(torch::equal(ours.isposinf(), theirs.isposinf())) << length << " tokens";
    EXPECT_TRUE(torch::isfinite(ours[3]).all().item<bool>()) << length << " tokens";
    EXPECT_LE(error_to_scale(ours[3], reference(x.slice(0, 3), s, w)[0]), 64 * std::numeric_limits<float>::epsilon());
  }
}

// A call with a mask, or asking for weights that are read, runs the native op, whether the mask is
// a constant or a value of the graph (a forward's Optional argument, known when the call runs:
// None runs ours); weights asked for and dropped are not computed; cross-attention is not
// rewritten.
TEST(SelfAttention, MasksAndWeightsRunTheNativeOp) {
  const Shape s{32, 4};
  const Weights w = random_weights(s);
  const torch::Tensor x = torch::randn({3, 5, s.embed});
  torch::Tensor padding = torch::zeros({3, 5}, torch::kBool);
  padding.index_put_({1, 4}, true);
  const struct {
    const char* arguments;
    const char* parameters;
    const char* returned;
    std::vector<torch::IValue> inputs;
    int native;
    const char* why;
  } cases[] = {
      {"mask, False, True, 1", "x, mask", "r[0]", {x, padding}, 1, "a padding mask"},
      {"mask, False, True, 1", "x, mask: Optional[Tensor]", "r[0]", {x, torch::IValue()}, 0, "a mask argument of None"},
      {"None, True", "x", "r[0] + r[1].mean()", {x}, 1, "the weights asked for and read"},
      {"None, True", "x", "r[0]", {x}, 0, "the weights asked for and dropped"}};
  for (const auto& c : cases) {
    jit::Module native = native_call(s, w, "x, x, x", c.arguments, c.parameters, c.returned);
    jit::Module prepared = prepare_for_inference(native);
    EXPECT_EQ(count_kind(prepared, "afterburner::self_attention"), 1) << c.why;
    torch::Tensor ours;
    EXPECT_EQ(native_calls([&] { ours = answer(prepared, c.inputs); }), c.native) << c.why;
    if (c.native) {
      EXPECT_TRUE(BitwiseEqual(ours, answer(native, c.inputs))) << c.why;
    } else {
      EXPECT_LE(error_to_scale(ours, reference(x, s, w)), 64 * std::numeric_limits<float>::epsilon()) << c.why;
    }
  }
  jit::Module cross = prepare_for_inference(native_call(s, w, "x, y, y", "None, False", "x, y"));
  EXPECT_EQ(count_kind(cross, "afterburner::self_attention"), 0);
}

// Inputs self_attention does not compute get the native op's answer (double, unbatched) or its
// error (features other than embed_dim), bit for bit and word for word.
TEST(SelfAttention, HandsWhatItDoesNotTakeToTheNativeOp) {
  const Shape s{32, 4};
  const Weights w = random_weights(s);
  const auto native = [&](const torch::Tensor& x, const Weights& v) {
    return std::get<0>(at::_native_multi_head_attention(x, x, x, s.embed, s.heads, v.qkv_weight, v.qkv_bias,
                                                        v.proj_weight, v.proj_bias, c10::nullopt, false));
  };
  const auto ours = [&](const torch::Tensor& x, const Weights& v) { return self_attention(x, s.embed, s.heads, v); };
  const Weights in_double{w.qkv_weight.to(torch::kDouble), w.qkv_bias.to(torch::kDouble),
                          w.proj_weight.to(torch::kDouble), w.proj_bias.to(torch::kDouble)};
  const torch::Tensor x = torch::randn({2, 5, s.embed}, torch::kDouble);
  EXPECT_EQ(native_calls([&] { ours(x, in_double); }), 1);
  EXPECT_TRUE(BitwiseEqual(ours(x, in_double), native(x, in_double)));
  const torch::Tensor no_tokens = torch::randn({2, 0, s.embed});
  EXPECT_TRUE(BitwiseEqual(ours(no_tokens, w), native(no_tokens, w)));
  const torch::Tensor wrong_width = torch::randn({2, 5, s.embed + 1});
  const auto refusal = [&](const std::function<torch::Tensor()>& call) -> std::string {
    try {
      call();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "nothing thrown";
  };
  const std::string native_refusal = refusal([&] { return native(wrong_width, w); });
  EXPECT_NE(native_refusal, "nothing thrown");
  EXPECT_EQ(refusal([&] { return ours(wrong_width, w); }), native_refusal);
}

// The kernel contract: x and the weights bitwise unchanged, a fresh output.
TEST(SelfAttention, LeavesItsInputsAsTheyWere) {
  const Shape s{64, 8};
  const Weights w = random_weights(s);
  const Weights copies{w.qkv_weight.clone(), w.qkv_bias.clone(), w.proj_weight.clone(), w.proj_bias.clone()};
  for (const int64_t length : {5, 197}) {
    const torch::Tensor x = torch::randn({2, length, s.embed}), before = x.clone();
    const torch::Tensor y = self_attention(x, s.embed, s.heads, w);
    EXPECT_TRUE(BitwiseEqual(x, before));
    EXPECT_TRUE(BitwiseEqual(w.qkv_weight, copies.qkv_weight) && BitwiseEqual(w.qkv_bias, copies.qkv_bias) &&
                BitwiseEqual(w.proj_weight, copies.proj_weight) && BitwiseEqual(w.proj_bias, copies.proj_bias));
    for (const torch::Tensor* t : {&x, &w.qkv_weight, &w.qkv_bias, &w.proj_weight, &w.proj_bias}) {
      EXPECT_FALSE(y.is_alias_of(*t));
    }
  }
}

// ---- TransformerEncoderLayer's fast path ----

struct Layer {
  bool use_gelu, norm_first;
};

EncoderLayerWeights random_layer(const Shape& s, const Layer& l, int64_t hidden) {
  const auto around = [](int64_t n, double center) { return torch::randn({n}) * 0.1 + center; };
  return {l.use_gelu,
          l.norm_first,
          1e-5,
          around(s.embed, 1),
          around(s.embed, 0),
          around(s.embed, 1),
          around(s.embed, 0),
          torch::randn({hidden, s.embed}) / std::sqrt(double(s.embed)),
          around(hidden, 0),
          torch::randn({s.embed, hidden}) / std::sqrt(double(hidden)),
          around(s.embed, 0)};
}

// A module in eval mode calling TransformerEncoderLayer's fast path on x, with `mask`.
jit::Module encoder_layer_call(const Shape& s, const Weights& a, const EncoderLayerWeights& w,
                               const std::string& mask_and_type = "None, None", const std::string& parameters = "x") {
  jit::Module module("__torch__.EncoderFastPath");
  const std::vector<std::pair<const char*, torch::Tensor>> tensors{
      {"w", a.qkv_weight},       {"b", a.qkv_bias},       {"wo", a.proj_weight},     {"bo", a.proj_bias},
      {"n1w", w.norm1_weight},   {"n1b", w.norm1_bias},   {"n2w", w.norm2_weight},   {"n2b", w.norm2_bias},
      {"f1w", w.linear1_weight}, {"f1b", w.linear1_bias}, {"f2w", w.linear2_weight}, {"f2b", w.linear2_bias}};
  for (const auto& [name, tensor] : tensors) module.register_parameter(name, tensor, false);
  module.define(fmt::format(
      "def forward(self, {}):\n"
      "    return torch._transformer_encoder_layer_fwd(x, {}, {}, self.w, self.b, self.wo, self.bo, {}, {}, {}, "
      "self.n1w, self.n1b, self.n2w, self.n2b, self.f1w, self.f1b, self.f2w, self.f2b, {})\n",
      parameters, s.embed, s.heads, w.use_gelu ? "True" : "False", w.norm_first ? "True" : "False", w.eps,
      mask_and_type));
  module.eval();
  return module;
}

// The layer from its definition, in double.
torch::Tensor reference_layer(const torch::Tensor& src, const Shape& s, const Weights& a,
                              const EncoderLayerWeights& w) {
  const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  const auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
    return torch::layer_norm(x, {s.embed}, d(weight), d(bias), w.eps);
  };
  const auto feed_forward = [&](const torch::Tensor& x) {
    const torch::Tensor hidden = torch::linear(x, d(w.linear1_weight), d(w.linear1_bias));
    return torch::linear(w.use_gelu ? torch::gelu(hidden) : torch::relu(hidden), d(w.linear2_weight),
                         d(w.linear2_bias));
  };
  const torch::Tensor x0 = d(src);
  if (w.norm_first) {
    const torch::Tensor x = x0 + reference(norm(x0, w.norm1_weight, w.norm1_bias), s, a);
    return x + feed_forward(norm(x, w.norm2_weight, w.norm2_bias));
  }
  const torch::Tensor x = norm(x0 + reference(x0, s, a), w.norm1_weight, w.norm1_bias);
  return norm(x + feed_forward(x), w.norm2_weight, w.norm2_bias);
}

// Post-norm and pre-norm, ReLU and GELU, at batch 1, 2 and 7 over 5 and 197 tokens: within float
// rounding of the double answer (measured up to 1.2 epsilons of the scale, as LibTorch's own op),
// bounded at 64; twice the same, NaN and infinities where the native op puts them, the input left
// alone.
TEST(EncoderLayer, FastPathRoutedOntoOursWithinFloatRoundingTwiceTheSame) {
  const double bound = 64 * std::numeric_limits<float>::epsilon();
  const Shape s{32, 4};
  for (const Layer& l : {Layer{false, false}, Layer{true, false}, Layer{false, true}, Layer{true, true}}) {
    torch::manual_seed(l.use_gelu * 2 + l.norm_first);
    const Weights a = random_weights(s);
    const EncoderLayerWeights w = random_layer(s, l, 48);
    jit::Module native = encoder_layer_call(s, a, w);
    jit::Module prepared = prepare_for_inference(native);
    const std::string layer =
        fmt::format("{}, {}", l.norm_first ? "pre-norm" : "post-norm", l.use_gelu ? "GELU" : "ReLU");
    ASSERT_EQ(count_kind(prepared, "afterburner::encoder_layer"), 1) << layer;
    for (const int64_t batch : {1, 2, 7}) {
      for (const int64_t length : {5, 197}) {
        const std::string what = fmt::format("{}, batch {}, {} tokens", layer, batch, length);
        torch::Tensor x = torch::randn({batch, length, s.embed});
        const torch::Tensor before = x.clone();
        const torch::Tensor exact = reference_layer(x, s, a, w);
        torch::Tensor first;
        EXPECT_EQ(native_calls([&] { first = answer(prepared, {x}); }), 0) << what;
        EXPECT_LE(error_to_scale(first, exact), bound) << what;
        EXPECT_LE(error_to_scale(answer(native, {x}), exact), bound) << what << ": LibTorch's own";
        EXPECT_TRUE(BitwiseEqual(answer(prepared, {x}), first)) << what << ": a second call answered otherwise";
        EXPECT_TRUE(BitwiseEqual(x, before)) << what << ": the input moved";
        x.index_put_({0, length - 1, 0}, std::numeric_limits<float>::quiet_NaN());
        if (batch > 1) x.index_put_({1, 0, 1}, -std::numeric_limits<float>::infinity());
        const torch::Tensor ours = answer(prepared, {x}), theirs = answer(native, {x});
        EXPECT_TRUE(torch::equal(ours.isnan(), theirs.isnan())) << what << " with NaN and -inf";
        EXPECT_TRUE(torch::equal(ours.isposinf(), theirs.isposinf())) << what << " with NaN and -inf";
        EXPECT_TRUE(torch::equal(ours.isneginf(), theirs.isneginf())) << what << " with NaN and -inf";
      }
    }
  }
}

// A padding mask runs the native op; a mask argument of None, ours.
TEST(EncoderLayer, AMaskRunsTheNativeOp) {
  const Shape s{32, 4};
  const Weights a = random_weights(s);
  const EncoderLayerWeights w = random_layer(s, {false, false}, 48);
  jit::Module native = encoder_layer_call(s, a, w, "mask, 1", "x, mask: Optional[Tensor]");
  jit::Module prepared = prepare_for_inference(native);
  EXPECT_EQ(count_kind(prepared, "afterburner::encoder_layer"), 1);
  const torch::Tensor x = torch::randn({3, 5, s.embed});
  torch::Tensor padding = torch::zeros({3, 5}, torch::kBool);
  padding.index_put_({2, 3}, true);
  torch::Tensor ours;
  EXPECT_EQ(native_calls([&] { ours = answer(prepared, {x, padding}); }), 1);
  EXPECT_TRUE(BitwiseEqual(ours, answer(native, {x, padding})));
  EXPECT_EQ(native_calls([&] { ours = answer(prepared, {x, torch::IValue()}); }), 0);
  EXPECT_LE(error_to_scale(ours, reference_layer(x, s, a, w)), 64 * std::numeric_limits<float>::epsilon());
}

// Inputs encoder_layer does not compute (double) get the native op's answer, bit for bit.
TEST(EncoderLayer, HandsWhatItDoesNotTakeToTheNativeOp) {
  const Shape s{32, 4};
  const Weights a = random_weights(s);
  const EncoderLayerWeights w = random_layer(s, {true, false}, 48);
  const auto native = [&](const torch::Tensor& x, const Weights& v, const EncoderLayerWeights& u) {
    return at::_transformer_encoder_layer_fwd(x, s.embed, s.heads, v.qkv_weight, v.qkv_bias, v.proj_weight, v.proj_bias,
                                              u.use_gelu, u.norm_first, u.eps, u.norm1_weight, u.norm1_bias,
                                              u.norm2_weight, u.norm2_bias, u.linear1_weight, u.linear1_bias,
                                              u.linear2_weight, u.linear2_bias);
  };
  const auto in_double = [](torch::Tensor t) { return t.to(torch::kDouble); };
  const Weights a_double{in_double(a.qkv_weight), in_double(a.qkv_bias), in_double(a.proj_weight),
                         in_double(a.proj_bias)};
  EncoderLayerWeights w_double = w;
  for (torch::Tensor* t :
       {&w_double.norm1_weight, &w_double.norm1_bias, &w_double.norm2_weight, &w_double.norm2_bias,
        &w_double.linear1_weight, &w_double.linear1_bias, &w_double.linear2_weight, &w_double.linear2_bias}) {
    *t = in_double(*t);
  }
  const torch::Tensor x = torch::randn({2, 5, s.embed});
  EXPECT_EQ(native_calls([&] { encoder_layer(x.to(torch::kDouble), s.embed, s.heads, a_double, w_double); }), 1);
  EXPECT_TRUE(BitwiseEqual(encoder_layer(x.to(torch::kDouble), s.embed, s.heads, a_double, w_double),
                           native(x.to(torch::kDouble), a_double, w_double)));
}

// ---- MultiheadAttention's composed forward ----

jit::Module composed(const std::string& body) {
  jit::Module module("__torch__.Composed");
  module.define("def forward(self, q, k, v):\n" + body);
  module.eval();
  return module;
}

// softmax(q k^T) v in double, q already scaled.
torch::Tensor reference_composed(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  return d(q).bmm(d(k).transpose(1, 2)).softmax(-1).bmm(d(v));
}

// bmm(softmax(bmm(q / sqrt(D), k^T)), v), as MultiheadAttention's forward composes it, over 1 to
// 197 keys and 1 to 48 heads x batch: within float rounding of the double answer, twice the same,
// NaN where the composed ops put it.
TEST(ComposedAttention, BmmSoftmaxBmmRunsOnTheFusedKernel) {
  jit::Module native =
      composed("    return torch.bmm(torch.softmax(torch.bmm(q / 4.0, k.transpose(-2, -1)), -1), v)\n");
  jit::Module prepared = prepare_for_inference(native);
  ASSERT_EQ(count_kind(prepared, "afterburner::attention"), 1);
  EXPECT_EQ(count_kind(prepared, "aten::bmm"), 0);
  for (const int64_t heads : {1, 6, 48}) {
    for (const int64_t length : {1, 5, 197}) {
      const std::string what = fmt::format("{} heads x batch, {} tokens", heads, length);
      torch::Tensor q = torch::randn({heads, length, 16}), k = torch::randn({heads, length, 16});
      const torch::Tensor v = torch::randn({heads, length, 16});
      const torch::Tensor first = answer(prepared, {q, k, v});
      EXPECT_LE(error_to_scale(first, reference_composed(q / 4.0, k, v)), 64 * std::numeric_limits<float>::epsilon())
          << what;
      EXPECT_TRUE(BitwiseEqual(answer(prepared, {q, k, v}), first)) << what;
      k.index_put_({0, length - 1, 3}, std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(torch::equal(answer(prepared, {q, k, v}).isnan(), answer(native, {q, k, v}).isnan())) << what;
    }
  }
}

// Probabilities read elsewhere (the attention weights asked for), or a softmax over the queries,
// stay LibTorch's ops.
TEST(ComposedAttention, OtherCompositionsStayAsTheyAre) {
  for (const char* body : {"    p = torch.softmax(torch.bmm(q, k.transpose(-2, -1)), -1)\n"
                           "    return torch.bmm(p, v), p.mean(0)\n",
                           "    return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)), 1), v)\n"}) {
    EXPECT_EQ(count_kind(prepare_for_inference(composed(body)), "afterburner::attention"), 0) << body;
  }
}

}  // namespace
}  // namespace afterburner::infer::attention_fast_paths_test
