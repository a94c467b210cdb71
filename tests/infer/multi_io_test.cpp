// Models with several inputs, integer inputs and tuple outputs through verify, measure, the
// bf16 rewrite and optimize_file's example inputs, against hand-computed expectations.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include "afterburner/core/error.h"
#include "afterburner/infer/measure.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/infer/optimize_file.h"
#include "afterburner/infer/verify.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

// forward(x, y) = (x + offset, y): the first output's difference between two such models is
// `offset`, the second's none.
torch::jit::Module two_in_two_out(const torch::Tensor& offset) {
  torch::jit::Module model("__torch__.TwoInTwoOut");
  model.register_buffer("offset", offset);
  model.define("def forward(self, x, y):\n    return x + self.offset, y\n");
  return model;
}

// Token ids [N, L] (int64) and features [N, D]: (table[tokens].sum(1) + features, tokens).
torch::jit::Module embedding_bag() {
  torch::jit::Module model("__torch__.EmbeddingBag");
  model.register_parameter("table", torch::randn({20, 8}), false);
  model.define(
      "def forward(self, tokens, features):\n"
      "    return self.table[tokens].sum(1) + features, tokens\n");
  model.eval();
  return model;
}

TEST(VerifyOutputs, ComparesEveryOutputOfATuple) {
  auto x = torch::tensor({{0.0f, 1.0f}, {2.0f, 0.0f}}), y = torch::ones({2, 3});
  auto original = two_in_two_out(torch::zeros({2}));
  auto optimized = two_in_two_out(torch::tensor({3.0f, 0.0f}));  // flips row 0's argmax only
  auto outputs = infer::verify_outputs(original, optimized, {x, y}, /*batch_size=*/1);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_DOUBLE_EQ(outputs[0].max_abs_diff, 3.0);
  EXPECT_DOUBLE_EQ(outputs[0].top1_agreement, 0.5);
  EXPECT_DOUBLE_EQ(outputs[1].max_abs_diff, 0.0);
  EXPECT_DOUBLE_EQ(outputs[1].top1_agreement, 1.0);
  EXPECT_EQ(outputs[1].samples, 2);
  const auto worst = infer::worst(outputs);
  EXPECT_DOUBLE_EQ(worst.max_abs_diff, 3.0);
  EXPECT_DOUBLE_EQ(worst.top1_agreement, 0.5);
  EXPECT_FALSE(infer::within(outputs, infer::Tolerance().max_abs_diff(3).min_top1_agreement(0.6)));
  EXPECT_TRUE(infer::within(outputs, infer::Tolerance().max_abs_diff(3).min_top1_agreement(0.5)));
  EXPECT_TRUE(Contains(infer::describe(outputs), "output 1: max abs diff 0, top-1 agreement 100.00% (2 samples)"));
}

TEST(VerifyOutputs, TopOneCountsEveryPositionOfASequence) {
  // [N=2, L=2, classes=2]: the offset flips the argmax at 3 of the 4 positions.
  auto x = torch::tensor({{{0.0f, 1.0f}, {0.0f, 2.0f}}, {{0.0f, 1.5f}, {0.0f, 9.0f}}});
  auto original = two_in_two_out(torch::zeros({2}));
  auto optimized = two_in_two_out(torch::tensor({3.0f, 0.0f}));
  auto outputs = infer::verify_outputs(original, optimized, {x, torch::zeros({2})});
  EXPECT_DOUBLE_EQ(outputs[0].top1_agreement, 0.25);
  EXPECT_EQ(outputs[0].samples, 2);
  // A vector output [N] has no classes: its argmax would run across the samples.
  auto vector_original = two_in_two_out(torch::zeros({4}));
  auto vector_optimized = two_in_two_out(torch::tensor({10.0f, 0.0f, 0.0f, 0.0f}));
  auto vector_outputs = infer::verify_outputs(vector_original, vector_optimized,
                                              {torch::tensor({0.0f, 1.0f, 3.0f, 2.0f}), torch::zeros({4})});
  EXPECT_DOUBLE_EQ(vector_outputs[0].max_abs_diff, 10.0);
  EXPECT_DOUBLE_EQ(vector_outputs[0].top1_agreement, 1.0);
}

TEST(VerifyOutputs, DifferentOutputCountsAreAnError) {
  auto original = two_in_two_out(torch::zeros({2}));
  torch::jit::Module single("__torch__.Single");
  single.define("def forward(self, x, y):\n    return x\n");
  auto message = error_message<Error>(
      [&] { infer::verify_outputs(original, single, {torch::ones({3, 2}), torch::ones({3, 2})}); });
  EXPECT_TRUE(Contains(message, "the original model returns 2 outputs, the optimized one 1"));
}

TEST(MeasureInputs, CutsEveryBatchSizeFromTheExamples) {
  auto model = embedding_bag();
  const auto tokens = torch::randint(0, 20, {3, 5}), features = torch::randn({3, 8});
  auto speed = infer::measure_inputs(model, {tokens, features},
                                     infer::MeasureOptions().batch_sizes({2, 7}).seconds_per_batch_size(0.001));
  ASSERT_EQ(speed.points.size(), 2u);
  EXPECT_EQ(speed.points[1].batch_size, 7);  // rows repeat past the 3 examples
  auto message = error_message<UsageError>(
      [&] { infer::measure_inputs(model, {tokens, features.slice(0, 0, 2)}, infer::MeasureOptions()); });
  EXPECT_TRUE(Contains(message, "examples: every example input needs the same number of rows"));
}

TEST(OptimizeBf16, IntegerInputsAndOutputsPassAsTheyAre) {
  auto model = embedding_bag();
  const auto tokens = torch::randint(0, 20, {4, 5}), features = torch::randn({4, 8});
  auto optimized = infer::optimize(model, infer::OptimizeOptions().precision(infer::Precision::bf16)).model;
  c10::InferenceMode inference;
  const auto expected = model.forward({tokens, features}).toTuple()->elements();
  const auto actual = optimized.forward({tokens, features}).toTuple()->elements();
  ASSERT_EQ(actual.size(), 2u);
  EXPECT_EQ(actual[0].toTensor().scalar_type(), torch::kFloat);
  // bf16 keeps 8 significant bits of each of the 5 table rows summed.
  EXPECT_TRUE(torch::allclose(actual[0].toTensor(), expected[0].toTensor(), 0.02, 0.05));
  EXPECT_TRUE(torch::equal(actual[1].toTensor(), tokens));
}

TEST(OptimizeBf16, OtherReturnTypesAreRefusedByName) {
  torch::jit::Module model("__torch__.ReturnsAList");
  model.define("def forward(self, x):\n    return [x, x]\n");
  auto message = error_message<Error>(
      [&] { infer::optimize(model, infer::OptimizeOptions().precision(infer::Precision::bf16)); });
  EXPECT_TRUE(Contains(message, "bf16 handles models returning a tensor or a tuple of tensors; forward returns "
                                "List[Tensor]"));
}

TEST(OptimizeFile, ExampleInputsMayBeAList) {
  TempDir dir;
  infer::save_model(embedding_bag(), (dir / "model.pt").string());
  c10::List<torch::Tensor> examples({torch::randint(0, 20, {16, 5}), torch::randn({16, 8})});
  const auto bytes = torch::jit::pickle_save(examples);
  write_file(dir / "examples.pt", std::string(bytes.begin(), bytes.end()));
  auto report = infer::optimize_file((dir / "model.pt").string(), (dir / "out.pt").string(),
                                     infer::OptimizeFileOptions()
                                         .example_inputs((dir / "examples.pt").string())
                                         .measure_seconds(0));
  EXPECT_EQ(report.verified_on, "16 example inputs from " + (dir / "examples.pt").string());
  ASSERT_EQ(report.outputs.size(), 2u);
  EXPECT_LT(report.outputs[0].max_abs_diff, 1e-5);
  EXPECT_EQ(report.outputs[1].max_abs_diff, 0.0);

  c10::List<torch::Tensor> uneven({torch::zeros({16, 5}, torch::kLong), torch::zeros({15, 8})});
  const auto uneven_bytes = torch::jit::pickle_save(uneven);
  write_file(dir / "uneven.pt", std::string(uneven_bytes.begin(), uneven_bytes.end()));
  auto message = error_message<DataError>([&] {
    infer::optimize_file((dir / "model.pt").string(), (dir / "out.pt").string(),
                         infer::OptimizeFileOptions().example_inputs((dir / "uneven.pt").string()).measure_seconds(0));
  });
  EXPECT_TRUE(Contains(message, (dir / "uneven.pt").string() +
                                    ": example inputs need the same number of rows, at least one, batch dimension "
                                    "first: got [16, 5] and [15, 8]"));
}

}  // namespace
}  // namespace afterburner::testing
