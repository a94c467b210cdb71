// kernels::attention against LibTorch's unfused composition softmax(q k^T * scale + mask) v,
// computed in double from the same input values: outputs and the gradients of q, k and v, at
// one row, odd and unequal lengths across the block edges of both kernels (the tiled one's 64
// query and 128 key rows; the short-key one's 128 keys, 16- and 8-row chunks and 64-row tasks),
// head dimensions 8, 12, 64 and 80, without a mask, with a bool and a float mask, causal, in
// fp32, bf16 and double; finite differences in double; rows that see no key; broadcasting;
// MultiheadAttention's transposed layouts; thread counts; bad arguments.
// The kernel contract (inputs unchanged, fresh outputs, second calls, NaN and infinities) is in
// invariants_test.cpp.
#include "afterburner/kernels/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "autograd_check.h"
#include "non_finite.h"

// A namespace of its own: the tests' unity build puts this file beside others with their own
// `reference` and `draw`.
namespace attention_test {
namespace {

using afterburner::kernels::attention;
using afterburner::testing::AgreesWithNonFinite;

enum class MaskKind { none, boolean, additive };

const char* to_string(MaskKind kind) {
  switch (kind) {
    case MaskKind::none: return "no mask";
    case MaskKind::boolean: return "bool mask";
    case MaskKind::additive: return "float mask";
  }
  return "?";
}

// The unfused composition in double, torch 2.x's way: a bool mask becomes 0 where true and -inf
// where false, causal the same for the upper triangle, and both are added to the scores; dropout
// factors multiply the probabilities.
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const c10::optional<torch::Tensor>& mask, bool causal, double scale,
                        const torch::Tensor& factors = {}) {
  const auto as_additive = [](const torch::Tensor& keep) {
    return torch::zeros(keep.sizes(), torch::kDouble).masked_fill(keep.logical_not(), -INFINITY);
  };
  torch::Tensor scores = torch::matmul(q.to(torch::kDouble), k.to(torch::kDouble).transpose(-2, -1)) * scale;
  if (mask) scores = scores + (mask->scalar_type() == torch::kBool ? as_additive(*mask) : mask->to(torch::kDouble));
  if (causal) scores = scores + as_additive(torch::ones({q.size(-2), k.size(-2)}, torch::kBool).tril());
  const torch::Tensor probabilities = torch::softmax(scores, -1);
  return torch::matmul(factors.defined() ? probabilities * factors.to(torch::kDouble) : probabilities,
                       v.to(torch::kDouble));
}

struct Problem {
  int64_t batch, heads, q_len, k_len, head_dim;
  MaskKind mask;
  bool causal;
};

struct Drawn {
  torch::Tensor q, k, v;
  c10::optional<torch::Tensor> mask;
};

// q, k, v standard normal in `dtype`, requiring grad; a bool mask keeping about 85% of the keys
// ([B, 1, Lq, Lk]: one per batch, shared by the heads), a float mask of normal values ([Lq, Lk]).
Drawn draw(const Problem& p, torch::Dtype dtype, uint64_t seed = 3) {
  torch::manual_seed(seed);
  const auto options = torch::TensorOptions().dtype(dtype);
  Drawn d{torch::randn({p.batch, p.heads, p.q_len, p.head_dim}, options).requires_grad_(),
          torch::randn({p.batch, p.heads, p.k_len, p.head_dim}, options).requires_grad_(),
          torch::randn({p.batch, p.heads, p.k_len, p.head_dim}, options).requires_grad_(), c10::nullopt};
  if (p.mask == MaskKind::boolean) d.mask = torch::rand({p.batch, 1, p.q_len, p.k_len}) < 0.85;
  if (p.mask == MaskKind::additive) d.mask = torch::randn({p.q_len, p.k_len}).to(dtype);
  return d;
}

struct Tolerance {
  double atol, rtol;  // atol relative to the largest expected magnitude, as in invariants.h
};

::testing::AssertionResult Close(const torch::Tensor& actual, const torch::Tensor& expected, Tolerance t) {
  const torch::Tensor magnitudes = expected.detach().abs();
  const torch::Tensor finite = magnitudes.masked_select(magnitudes.isfinite());
  const double largest = finite.numel() == 0 ? 0.0 : finite.max().item<double>();
  return AgreesWithNonFinite(actual, expected, t.atol * std::max(1.0, largest), t.rtol);
}

// Output and the three gradients for one fixed upstream gradient, ours against the reference.
void expect_matches_reference(const Problem& p, torch::Dtype dtype, Tolerance tolerance) {
  const Drawn d = draw(p, dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  const torch::Tensor ours = attention(d.q, d.k, d.v, d.mask, p.causal);
  const torch::Tensor expected = reference(d.q, d.k, d.v, d.mask, p.causal, scale);
  ASSERT_EQ(ours.scalar_type(), dtype);
  EXPECT_TRUE(Close(ours, expected, tolerance)) << "output";
  const torch::Tensor upstream = torch::randn(expected.sizes(), torch::kDouble);
  const auto our_grads = torch::autograd::grad({ours}, {d.q, d.k, d.v}, {upstream.to(dtype)});
  const auto expected_grads = torch::autograd::grad({expected}, {d.q, d.k, d.v}, {upstream});
  const char* names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(our_grads[i].scalar_type(), dtype) << names[i];
    EXPECT_TRUE(Close(our_grads[i], expected_grads[i], tolerance)) << names[i];
  }
}

// Shapes across the block edges: one row, lengths 7, 129 and 300, Lq != Lk both ways, batch 1,
// head dimensions 8, 64 and 80 (the tiled kernel: more than 128 keys, or double); and for the
// short-key kernel (fp32 and bf16, up to 128 keys) 17 rows (a 16-row chunk and an 8-row one), 25
// (16 + 9), 70 (two tasks), 128 keys, head dimension 12 (not a multiple of its 8 columns); and
// its matrices across lanes (heads up to 8 wide, up to 20 rows, at least 32 matrices): 36 matrices
// (two groups of 16 and a last of 4), 17 rows, head dimension 5 (padded to 8), Lq != Lk.
const std::vector<Problem> kShapes{
    {1, 1, 1, 1, 8, MaskKind::none, false},      {2, 3, 7, 7, 8, MaskKind::none, false},
    {1, 2, 129, 300, 64, MaskKind::none, false}, {2, 1, 300, 129, 80, MaskKind::none, false},
    {1, 1, 7, 1, 64, MaskKind::none, false},     {1, 2, 1, 129, 80, MaskKind::none, false},
    {3, 4, 17, 17, 8, MaskKind::none, false},    {2, 2, 25, 128, 12, MaskKind::none, false},
    {1, 3, 70, 49, 64, MaskKind::none, false},   {9, 4, 17, 17, 8, MaskKind::none, false},
    {11, 3, 20, 6, 5, MaskKind::none, false},
};

std::vector<Problem> every_mask_and_causality() {
  std::vector<Problem> problems;
  for (const MaskKind mask : {MaskKind::none, MaskKind::boolean, MaskKind::additive}) {
    for (const bool causal : {false, true}) {
      for (Problem p : kShapes) {
        p.mask = mask;
        p.causal = causal;
        problems.push_back(p);
      }
    }
  }
  return problems;
}

void expect_matches_reference_everywhere(torch::Dtype dtype, Tolerance tolerance) {
  for (const Problem& p : every_mask_and_causality()) {
    SCOPED_TRACE(::testing::Message() << "B " << p.batch << " H " << p.heads << " Lq " << p.q_len << " Lk " << p.k_len
                                      << " D " << p.head_dim << ", " << to_string(p.mask)
                                      << (p.causal ? ", causal" : ""));
    expect_matches_reference(p, dtype, tolerance);
  }
}

TEST(Attention, MatchesTheUnfusedOpsInDouble) { expect_matches_reference_everywhere(torch::kDouble, {1e-12, 1e-12}); }

// fp32 against double: sums of up to 300 products, each a few ulps (2^-24) off, and the exp
// polynomial's 1e-8 relative error: measured below 1e-6 of the largest magnitude.
TEST(Attention, MatchesTheUnfusedOpsInFloat) { expect_matches_reference_everywhere(torch::kFloat, {1e-5, 1e-5}); }

// bf16 inputs are exact in double, and the kernel computes in fp32, rounding only its results
// to bf16 (half an ulp: 2^-9 relative): two ulps (2^-7) leaves room for fp32's own error and
// nothing for a wrong result, which is off by far more.
TEST(Attention, MatchesTheUnfusedOpsInBFloat16) {
  expect_matches_reference_everywhere(torch::kBFloat16, {1.0 / 128, 1.0 / 128});
}

TEST(Attention, GradientsMatchFiniteDifferencesInDouble) {
  for (const MaskKind mask : {MaskKind::none, MaskKind::boolean, MaskKind::additive}) {
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << to_string(mask) << (causal ? ", causal" : ""));
      Drawn d = draw({2, 1, 5, 3, 4, mask, causal}, torch::kDouble);
      if (mask == MaskKind::boolean) d.mask->select(-1, 0).fill_(true);  // every row sees a key: no NaN
      const torch::Tensor weights = torch::randn({2, 1, 5, 4}, torch::kDouble);
      afterburner::testing::expect_gradients_match_finite_differences(
          [&](const std::vector<torch::Tensor>& in) {
            return (attention(in[0], in[1], in[2], d.mask, causal, 0.7) * weights).sum();
          },
          {d.q, d.k, d.v});
    }
  }
}

TEST(Attention, ScaleDefaultsToOneOverTheSquareRootOfTheHeadDimension) {
  const Drawn d = draw({1, 2, 5, 6, 16, MaskKind::none, false}, torch::kDouble);
  EXPECT_TRUE(Close(attention(d.q, d.k, d.v), reference(d.q, d.k, d.v, c10::nullopt, false, 0.25), {1e-12, 1e-12}));
  EXPECT_TRUE(Close(attention(d.q, d.k, d.v, {}, false, 2.5), reference(d.q, d.k, d.v, c10::nullopt, false, 2.5),
                    {1e-12, 1e-12}));
}

// Rows that see no key: NaN out, as softmax over all -inf makes them, with the gradients' NaN
// exactly where autograd of the unfused ops puts them (through the additive mask, everywhere
// the row reaches: its dq, and every dk and dv row of its head).
TEST(Attention, RowsThatSeeNoKeyAreNaNAsInTheUnfusedOps) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kDouble}) {
    for (const bool causal : {false, true}) {
      // the tiled kernel's, the short-key one's, its matrices across lanes
      for (const auto& [keys, rows, heads] :
           {std::tuple<int64_t, int64_t, int64_t>{140, 70, 2}, {20, 70, 2}, {20, 17, 16}}) {
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << (causal ? ", causal" : "") << ", " << keys
                                          << " keys, " << rows << " rows");
        const Problem p{2, heads, rows, keys, 8, MaskKind::boolean, causal};
        Drawn d = draw(p, dtype);
        d.mask = torch::ones({2, 1, rows, keys}, torch::kBool);
        (*d.mask)[1][0][3].fill_(false);         // batch 1: row 3 sees nothing
        (*d.mask)[0][0][rows - 4].fill_(false);  // batch 0: (with 70 rows) in the second query block
        const torch::Tensor ours = attention(d.q, d.k, d.v, d.mask, causal);
        const torch::Tensor expected = reference(d.q, d.k, d.v, d.mask, causal, 1.0 / std::sqrt(8.0));
        EXPECT_TRUE(ours[1][heads - 1][3].isnan().all().item<bool>());
        EXPECT_TRUE(ours[1][0][4].isfinite().all().item<bool>());
        EXPECT_TRUE(Close(ours, expected, {1e-5, 1e-5}));
        const torch::Tensor upstream = torch::randn(expected.sizes(), torch::kDouble);
        const auto our_grads = torch::autograd::grad({ours}, {d.q, d.k, d.v}, {upstream.to(dtype)});
        const auto expected_grads = torch::autograd::grad({expected}, {d.q, d.k, d.v}, {upstream});
        for (int i = 0; i < 3; ++i) {
          EXPECT_TRUE(Close(our_grads[i], expected_grads[i], {1e-5, 1e-5})) << "gradient " << i;
        }
      }
    }
  }
}

// A float mask of -inf over a whole row is the same as a bool one.
TEST(Attention, AnAdditiveMinusInfinityRowIsNaNToo) {
  const Drawn d = draw({1, 1, 5, 9, 8, MaskKind::none, false}, torch::kFloat);
  torch::Tensor mask = torch::zeros({5, 9});
  mask[2].fill_(-INFINITY);
  const torch::Tensor ours = attention(d.q, d.k, d.v, mask);
  EXPECT_TRUE(ours[0][0][2].isnan().all().item<bool>());
  EXPECT_TRUE(Close(ours, reference(d.q, d.k, d.v, mask, false, 1.0 / std::sqrt(8.0)), {1e-5, 1e-5}));
}

// The causal mask is added like any other: a NaN in a key the causal mask hides from the first
// rows still makes every row NaN, as the unfused ops do (NaN + -inf is NaN), so the kernel
// computes the hidden blocks it otherwise leaves out; an infinity in v likewise (0 * inf).
TEST(Attention, CausalHiddenBlocksPropagateNonFiniteValuesAsTheUnfusedOps) {
  for (const int which : {1, 2}) {
    // the tiled kernel's blocks, the short-key kernel's rows, its matrices across lanes
    for (const int64_t length : {200, 40, 18}) {
      SCOPED_TRACE(::testing::Message() << (which == 1 ? "NaN in k" : "inf in v") << ", length " << length);
      const Problem p{1, length == 18 ? 33 : 1, length, length, 8, MaskKind::none, true};
      Drawn d = draw(p, torch::kFloat);
      {
        torch::NoGradGuard no_grad;
        (which == 1 ? d.k : d.v)[0][0][length - 10][1] = which == 1 ? NAN : INFINITY;
      }
      const torch::Tensor ours = attention(d.q, d.k, d.v, c10::nullopt, true);
      const torch::Tensor expected = reference(d.q, d.k, d.v, c10::nullopt, true, 1.0 / std::sqrt(8.0));
      EXPECT_TRUE(Close(ours, expected, {1e-5, 1e-5}));
      const torch::Tensor upstream = torch::randn(expected.sizes(), torch::kDouble);
      const auto our_grads = torch::autograd::grad({ours}, {d.q, d.k, d.v}, {upstream.to(torch::kFloat)});
      const auto expected_grads = torch::autograd::grad({expected}, {d.q, d.k, d.v}, {upstream});
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(Close(our_grads[i], expected_grads[i], {1e-5, 1e-5})) << "gradient " << i;
    }
  }
}

// Leading dimensions broadcast as in torch 2.x's scaled_dot_product_attention: keys and values
// shared by the batch, a key-padding mask [B, 1, 1, Lk], a 1-D mask over the keys, 3-D inputs
// (MultiheadAttention's [B * H, L, D]); gradients come back in each input's own shape.
TEST(Attention, BroadcastsLeadingDimensions) {
  torch::manual_seed(5);
  const auto grad = torch::requires_grad();
  const torch::Tensor q = torch::randn({3, 2, 9, 8}, grad), k = torch::randn({2, 11, 8}, grad),
                      v = torch::randn({1, 2, 11, 6}, grad);
  const torch::Tensor padding = torch::rand({3, 1, 1, 11}) < 0.8;
  const torch::Tensor key_mask = torch::randn({11});
  for (const auto& mask : {c10::optional<torch::Tensor>(padding), c10::optional<torch::Tensor>(key_mask)}) {
    const torch::Tensor ours = attention(q, k, v, mask);
    ASSERT_EQ(ours.sizes(), (std::vector<int64_t>{3, 2, 9, 6}));
    const torch::Tensor expected = reference(q, k, v, mask, false, 1.0 / std::sqrt(8.0));
    EXPECT_TRUE(Close(ours, expected, {1e-5, 1e-5}));
    const auto our_grads = torch::autograd::grad({ours.sum()}, {q, k, v});
    const auto expected_grads = torch::autograd::grad({expected.sum()}, {q, k, v});
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(Close(our_grads[i], expected_grads[i], {1e-5, 1e-5})) << "gradient " << i;
  }
  const torch::Tensor heads_flat = torch::randn({6, 9, 8});
  EXPECT_TRUE(Close(attention(heads_flat, heads_flat, heads_flat),
                    reference(heads_flat, heads_flat, heads_flat, c10::nullopt, false, 1.0 / std::sqrt(8.0)),
                    {1e-5, 1e-5}));
}

// Under CPU bf16 autocast q, k and v run in bf16, as LibTorch's matmuls would: the result is
// the bf16 inputs' attention, and the gradients reach the fp32 inputs in fp32.
TEST(Attention, FollowsAutocast) {
  const Drawn d = draw({2, 2, 33, 70, 16, MaskKind::none, true}, torch::kFloat);
  torch::Tensor ours;
  {
    afterburner::testing::BFloat16Autocast autocast;
    ours = attention(d.q, d.k, d.v, c10::nullopt, true);
  }
  EXPECT_EQ(ours.scalar_type(), torch::kBFloat16);
  const torch::Tensor expected = attention(d.q.to(torch::kBFloat16), d.k.to(torch::kBFloat16), d.v.to(torch::kBFloat16),
                                           c10::nullopt, true);
  EXPECT_TRUE(afterburner::testing::BitwiseEqual(ours, expected));
  const auto grads = torch::autograd::grad({ours.to(torch::kFloat).sum()}, {d.q, d.k, d.v});
  for (const auto& g : grads) EXPECT_EQ(g.scalar_type(), torch::kFloat);
}

// q, k and v as MultiheadAttention hands them over: [B, H, L, D] views of its [B, L, H * D]
// projections. The results equal those of contiguous copies, bit for bit, in fp32 and bf16, with
// both kernels; the output of the short-key kernel comes laid out as [B, L, H, D], so that
// MultiheadAttention's transpose back is a view, and the gradients in their inputs' layouts.
TEST(Attention, ReadsMultiheadAttentionsTransposedViewsInPlace) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int64_t length : {17, 150, 19}) {  // 19: 36 matrices, across lanes
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", length " << length);
      torch::manual_seed(11);
      const int64_t batch = length == 19 ? 9 : 3, heads = 4, dim = 8;
      const auto projection = [&] {
        const torch::Tensor rows = torch::randn({batch, length, heads * dim}).to(dtype);
        return rows.reshape({batch, length, heads, dim}).transpose(1, 2);
      };
      const torch::Tensor q = projection().requires_grad_(), k = projection().requires_grad_(),
                          v = projection().requires_grad_();
      const torch::Tensor out = attention(q, k, v);
      const torch::Tensor upstream = torch::randn(out.sizes()).to(dtype);
      const auto grads = torch::autograd::grad({out}, {q, k, v}, {upstream});
      std::vector<torch::Tensor> copies;
      for (const auto& t : {q, k, v}) copies.push_back(t.detach().contiguous().requires_grad_());
      const torch::Tensor expected = attention(copies[0], copies[1], copies[2]);
      const auto expected_grads = torch::autograd::grad({expected}, copies, {upstream});
      EXPECT_TRUE(torch::equal(out, expected));
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(grads[i], expected_grads[i])) << "gradient " << i;
      if (length <= 128) {
        EXPECT_TRUE(out.transpose(1, 2).is_contiguous());
        for (int i = 0; i < 3; ++i) EXPECT_EQ(grads[i].strides(), (i == 0 ? q : i == 1 ? k : v).strides()) << i;
      }
    }
  }
}

// bf16 inputs are read into fp32 and computed as fp32 inputs are: the bf16 result is the fp32
// result for the same values rounded to nearest even, exactly (the short-key kernel rounds whole
// vectors at once), and dv alike (dq and dk take dO . O from the output as stored, rounded, as the
// tiled kernel does); NaN where it is NaN (LibTorch's own conversions differ in the NaN they write).
TEST(Attention, ShortKeysRoundTheirBFloat16ResultsAsLibTorchRounds) {
  // rows in lanes; matrices across lanes
  for (const Problem& p :
       {Problem{3, 2, 25, 40, 12, MaskKind::additive, true}, Problem{9, 4, 17, 20, 8, MaskKind::additive, true}}) {
    SCOPED_TRACE(::testing::Message() << p.batch * p.heads << " matrices of " << p.q_len << " rows");
    Drawn d = draw(p, torch::kBFloat16);
    d.q.data()[0][0][0][0] = NAN;  // a NaN row: its rounding too
    const auto as_float = [](const torch::Tensor& t) { return t.detach().to(torch::kFloat).requires_grad_(); };
    const torch::Tensor q = as_float(d.q), k = as_float(d.k), v = as_float(d.v);
    const torch::Tensor ours = attention(d.q, d.k, d.v, d.mask, true);
    const torch::Tensor in_float = attention(q, k, v, d.mask->to(torch::kFloat), true);
    EXPECT_TRUE(AgreesWithNonFinite(ours, in_float.to(torch::kBFloat16), 0, 0));
    const torch::Tensor upstream = torch::randn(ours.sizes()).to(torch::kBFloat16);
    const auto grads = torch::autograd::grad({ours}, {d.q, d.k, d.v}, {upstream});
    const auto float_grads = torch::autograd::grad({in_float}, {q, k, v}, {upstream.to(torch::kFloat)});
    EXPECT_TRUE(AgreesWithNonFinite(grads[2], float_grads[2].to(torch::kBFloat16), 0, 0));
  }
}

// Each task computes whole rows (and the backward whole matrices, or groups of them) in a fixed
// order: the result does not depend on the number of threads, bit for bit.
TEST(Attention, ShortKeysGiveTheSameBitsOnOneAndTwoThreads) {
  for (const Problem& p :
       {Problem{5, 3, 70, 33, 16, MaskKind::boolean, true}, Problem{12, 3, 17, 17, 8, MaskKind::boolean, true}}) {
    SCOPED_TRACE(::testing::Message() << p.batch * p.heads << " matrices of " << p.q_len << " rows");
    const Drawn d = draw(p, torch::kFloat);
    const auto run = [&](int threads) {
      at::set_num_threads(threads);
      const torch::Tensor out = attention(d.q, d.k, d.v, d.mask, true);
      auto grads = torch::autograd::grad({out}, {d.q, d.k, d.v}, {torch::ones_like(out)});
      grads.push_back(out);
      return grads;
    };
    const int threads = at::get_num_threads();
    const auto one = run(1), two = run(2);
    at::set_num_threads(threads);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(afterburner::testing::BitwiseEqual(one[i], two[i])) << i;
  }
}

// Dropout factors (MultiheadAttention's noise: 0 or 1 / (1 - p)) multiply the probabilities
// before v: against (softmax(...) * factors) v in double, output and gradients, for both kernels
// (the tiled one's cases on LibTorch's ops), fp32, bf16 and double, factors per head or broadcast
// over the batch, with a mask and causal.
TEST(Attention, DropoutFactorsScaleTheProbabilitiesAsMultiheadAttentionsDropout) {
  for (const torch::Dtype dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    // rows in lanes, the tiled kernel, matrices across lanes
    for (const Problem& p :
         {Problem{2, 3, 21, 17, 8, MaskKind::boolean, true}, Problem{2, 3, 21, 150, 8, MaskKind::boolean, true},
          Problem{12, 3, 19, 17, 8, MaskKind::boolean, true}}) {
      for (const bool per_head : {true, false}) {
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << ", " << p.batch * p.heads << " x " << p.q_len
                                          << " x " << p.k_len << (per_head ? ", per head" : ", broadcast"));
        Drawn d = draw(p, dtype);
        d.mask->select(-1, 0).fill_(true);  // every row sees a key: no NaN
        const auto shape = per_head ? std::vector<int64_t>{p.batch, p.heads, p.q_len, p.k_len}
                                    : std::vector<int64_t>{p.q_len, p.k_len};
        const torch::Tensor factors = (torch::rand(shape) > 0.1).to(torch::kFloat) / 0.9;
        const torch::Tensor ours = attention(d.q, d.k, d.v, d.mask, true, c10::nullopt, factors);
        const torch::Tensor expected = reference(d.q, d.k, d.v, d.mask, true, 1.0 / std::sqrt(8.0), factors);
        const Tolerance tolerance = dtype == torch::kBFloat16 ? Tolerance{1.0 / 128, 1.0 / 128}
                                    : dtype == torch::kFloat  ? Tolerance{1e-5, 1e-5}
                                                              : Tolerance{1e-12, 1e-12};
        EXPECT_TRUE(Close(ours, expected, tolerance)) << "output";
        const torch::Tensor upstream = torch::randn(expected.sizes(), torch::kDouble);
        const auto our_grads = torch::autograd::grad({ours}, {d.q, d.k, d.v}, {upstream.to(dtype)});
        const auto expected_grads = torch::autograd::grad({expected}, {d.q, d.k, d.v}, {upstream});
        for (int i = 0; i < 3; ++i) EXPECT_TRUE(Close(our_grads[i], expected_grads[i], tolerance)) << "gradient " << i;
      }
    }
  }
}

// Empty sequences: no key gives zeros (the composition's empty sum), no query an empty result.
TEST(Attention, EmptySequencesGiveWhatTheUnfusedOpsGive) {
  const torch::Tensor q = torch::randn({2, 3, 4}, torch::requires_grad()), none = torch::randn({2, 0, 4});
  const torch::Tensor out = attention(q, none, none);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_TRUE(torch::equal(out, torch::zeros({2, 3, 4})));
  EXPECT_EQ(attention(none, q, q).sizes(), (std::vector<int64_t>{2, 0, 4}));
}

TEST(Attention, RefusesBadArgumentsNamingThem) {
  const torch::Tensor q = torch::randn({2, 5, 8}), k = torch::randn({2, 7, 8}), v = torch::randn({2, 7, 4});
  const auto expect_refused = [](const std::function<void()>& call, const std::string& named) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected a refusal naming " << named;
    } catch (const afterburner::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { attention(q, torch::randn({2, 7, 6}), v); }, "attention key");
  expect_refused([&] { attention(q, k, torch::randn({2, 6, 4})); }, "attention value");
  expect_refused([&] { attention(torch::randn({8}), k, v); }, "attention query");
  expect_refused([&] { attention(q, k.to(torch::kDouble), v); }, "one dtype");
  expect_refused([&] { attention(q.to(torch::kInt), k, v); }, "attention query");
  expect_refused([&] { attention(q, torch::randn({3, 7, 8}), v); }, "do not broadcast");
  expect_refused([&] { attention(q, k, v, torch::ones({5, 6}, torch::kBool)); }, "attention attn_mask");
  expect_refused([&] { attention(q, k, v, torch::ones({5, 7}, torch::kInt)); }, "attention attn_mask");
  expect_refused([&] { attention(q, k, v, torch::zeros({5, 7}, torch::requires_grad())); }, "attention attn_mask");
  const auto with_factors = [&](const torch::Tensor& factors) { attention(q, k, v, {}, false, {}, factors); };
  expect_refused([&] { with_factors(torch::ones({5, 7}, torch::kBool)); }, "attention dropout_mask");
  expect_refused([&] { with_factors(torch::ones({5, 6})); }, "attention dropout_mask");
  expect_refused([&] { with_factors(torch::ones({5, 7}, torch::requires_grad())); }, "attention dropout_mask");
  expect_refused([&] { with_factors(torch::ones({3, 5, 7})); }, "do not broadcast");
}

}  // namespace
}  // namespace attention_test
