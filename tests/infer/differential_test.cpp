// Every model path of afterburner against Python PyTorch, on models users write in Python
// (tests/infer/user_models.py): the file as loaded, as served (infer::load_optimized), after
// `afterburner optimize` at each precision and after `afterburner sketch`. The serving paths over
// HTTP are in tests/serve/differential_serve_test.cpp; both add rows to
// <build>/differential-report.md.
//
// Tolerances: fp32 paths match Python elementwise within 1e-5 absolute + 1e-5 relative (float
// reassociation: oneDNN's convolutions and GEMMs sum in another order; observed up to 4e-7, and
// 9e-6 on sketched outputs of magnitude 10). bf16 rounds every layer's inputs and weights to 8
// significant bits, int8 quantizes the Linear layers' weights and activations: both within 0.05
// absolute of Python's fp32 outputs (observed up to 1.6e-2 and 1.1e-2) with the argmax over the
// last dimension unchanged in at least 95% of positions (observed 98.6% and up). The models
// keep their default random initialisation, so their logits lie close together and a rounding
// may flip a near tie: the agreement bound allows a few, the max abs bound the size. Inputs
// holding NaN and infinities get NaN and infinities exactly where Python's outputs have them on
// every path but int8, which refuses them.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <fmt/format.h>

#include "afterburner/core/error.h"
#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/infer/optimize_file.h"
#include "afterburner/sketch/script.h"
#include "testing.h"
#include "user_models.h"

namespace afterburner::testing {
namespace {

Tolerance tolerance_of(infer::Precision precision) {
  switch (precision) {
    case infer::Precision::fp32: return kExact;
    case infer::Precision::bf16: return Tolerance{0.05, 0, 0.95};
    case infer::Precision::int8: return Tolerance{0.05, 0, 0.95};
  }
  return kExact;
}

// What optimize's own verification (original against optimized, on Python's batch of 64) is
// told to accept, as a user passes --tolerance and --min-agreement: the differential bounds.
// Its defaults ask reduced precisions for 99% or more top-1 agreement, which trained models
// meet (tests/infer/cli_test.cpp); one near tie flipped among these 64 samples is 98.4%.
infer::Tolerance verification_tolerance(infer::Precision precision) {
  if (precision == infer::Precision::fp32) return infer::default_tolerance(precision);
  const Tolerance bound = tolerance_of(precision);
  return infer::Tolerance().max_abs_diff(bound.atol).min_top1_agreement(*bound.min_top1);
}

TEST(Differential, CorpusIsTheModelsPythonWrote) { EXPECT_EQ(generated_model_names(), user_model_names()); }

TEST(Differential, TorchScriptAsLoaded) {
  for (const auto& name : user_model_names()) {
    const UserModel& model = user_model(name);
    auto module = torch::jit::load(model.file.string());
    auto check = check_path(model, "torch::jit::load", run_module(module), kExact);
    EXPECT_TRUE(check.passed) << name << ": " << check.failure;
    auto non_finite = check_non_finite(model, "torch::jit::load", run_module(module), kExact);
    EXPECT_TRUE(non_finite.passed) << name << ": " << non_finite.failure;
  }
}

// What `afterburner serve` runs for a model file: frozen, oneDNN layouts, matmuls on oneDNN.
TEST(Differential, LoadOptimized) {
  for (const auto& name : user_model_names()) {
    const UserModel& model = user_model(name);
    auto module = infer::load_optimized(model.file.string());
    auto check = check_path(model, "infer::load_optimized", run_module(module), kExact);
    EXPECT_TRUE(check.passed) << name << ": " << check.failure;
    auto non_finite = check_non_finite(model, "infer::load_optimized", run_module(module), kExact);
    EXPECT_TRUE(non_finite.passed) << name << ": " << non_finite.failure;
  }
}

class DifferentialOptimize : public ::testing::TestWithParam<std::string> {};

// optimize_file is `afterburner optimize` without the argument parsing; verified on the
// model's own example inputs (Python's batch of 64), no timing.
TEST_P(DifferentialOptimize, OptimizedFileLoadedAndServed) {
  const auto precision = infer::parse_precision(GetParam());
  const std::string label = "optimize " + infer::to_string(precision);
  for (const auto& name : user_model_names()) {
    const UserModel& model = user_model(name);
    TempDir dir;
    const auto optimized = dir / (name + "-" + infer::to_string(precision) + ".pt");
    try {
      infer::optimize_file(model.file.string(), optimized.string(),
                           infer::OptimizeFileOptions()
                               .precision(precision)
                               .example_inputs(model.examples.string())
                               .tolerance(verification_tolerance(precision))
                               .measure_seconds(0));
    } catch (const Error& e) {
      report_refusal(name, label + " -> load_optimized", e.what());
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    auto loaded = torch::jit::load(optimized.string());
    auto as_loaded = check_path(model, label + " -> torch::jit::load", run_module(loaded), tolerance_of(precision));
    EXPECT_TRUE(as_loaded.passed) << name << " as loaded: " << as_loaded.failure;
    auto served = infer::load_optimized(optimized.string());
    auto as_served = check_path(model, label + " -> load_optimized", run_module(served), tolerance_of(precision));
    EXPECT_TRUE(as_served.passed) << name << " as served: " << as_served.failure;
    if (precision == infer::Precision::int8 && model.non_finite) {
      // Dynamic quantization takes each call's scale from the input's min and max, which NaN and
      // infinities leave undefined: LibTorch refuses the call (Python too, for the same file)
      // rather than answer numbers.
      EXPECT_ANY_THROW(run_module(served)(model.non_finite->inputs)) << name;
      continue;
    }
    auto non_finite = check_non_finite(model, label + " -> load_optimized", run_module(served), tolerance_of(precision));
    EXPECT_TRUE(non_finite.passed) << name << " as served: " << non_finite.failure;
  }
}

INSTANTIATE_TEST_SUITE_P(Differential, DifferentialOptimize, ::testing::Values("fp32", "bf16", "int8"),
                         [](const auto& info) { return info.param; });

// No sketch is exact: a layer is sketched only when that saves weights, 2Lk(d_in + d_out) <
// d_in d_out for SKLinear (2Lk < C_out for SKConv2d), so every term has rank k below
// min(d_in, d_out) / 2, and its random sign matrices U have no orthonormal columns anyway
// (src/sketch/plan.cpp, sklinear.cpp). What must hold instead: the sketched file computes in
// our runtime what Python's torch.jit.load computes from it.
TEST(Differential, SketchedFileRunsAsInPython) {
  TempDir dir;
  std::vector<std::string> sketched;
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> to_run;
  for (const auto& name : user_model_names()) {
    const UserModel& model = user_model(name);
    torch::manual_seed(0);
    auto module = infer::load_model(model.file.string());
    const auto report = sketch::sketch_script(module, sketch::SketchConfig().terms(1).budget(0.5));
    if (report.replaced_count() == 0) {
      report_refusal(name, "sketch -> torch::jit::load",
                     fmt::format("no layer sketched ({} Linear or Conv2d layers, none cheaper sketched)",
                                 report.layers.size()));
      continue;
    }
    const auto file = dir / (name + "-sketched.pt");
    infer::save_model(module, file.string());
    sketched.push_back(name);
    to_run.emplace_back(file, user_models_dir() / (name + "_io.pt"));
  }
  const auto python = python_outputs(to_run);
  for (size_t i = 0; i < sketched.size(); ++i) {
    UserModel model = user_model(sketched[i]);
    model.file = to_run[i].first;
    model.batches = python[i];
    auto loaded = torch::jit::load(model.file.string());
    auto as_loaded = check_path(model, "sketch -> torch::jit::load", run_module(loaded), kExact);
    EXPECT_TRUE(as_loaded.passed) << model.name << " as loaded: " << as_loaded.failure;
    auto served = infer::load_optimized(model.file.string());
    auto as_served = check_path(model, "sketch -> load_optimized", run_module(served), kExact);
    EXPECT_TRUE(as_served.passed) << model.name << " as served: " << as_served.failure;
  }
}

// The CLI on the models random images cannot feed: several inputs, token ids, and a tuple out.
class DifferentialCli : public ::testing::Test {
 protected:
  CommandResult optimize(const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> args{"optimize", user_model(name).file.string(), "-o", (dir_ / "out.pt").string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(args);
  }

  // One line "afterburner: ..." on stderr holding every part.
  static ::testing::AssertionResult one_error_line(const CommandResult& result, const std::vector<std::string>& parts) {
    const std::string& err = result.err;
    if (err.rfind("afterburner: ", 0) != 0 || err.find('\n') != err.size() - 1) {
      return ::testing::AssertionFailure() << "not one error line: '" << err << "'";
    }
    for (const auto& part : parts) {
      if (err.find(part) == std::string::npos) return ::testing::AssertionFailure() << "'" << err << "' lacks '" << part << "'";
    }
    return ::testing::AssertionSuccess();
  }

  TempDir dir_;
};

TEST_F(DifferentialCli, OptimizeVerifiesAndMeasuresOnExampleInputs) {
  for (const std::string name : {"two_inputs_scripted", "embedding_traced", "two_outputs_scripted"}) {
    auto result = optimize(name, {"--precision", "bf16", "--example-inputs", user_model(name).examples.string(),
                                  "--measure-seconds", "0.01"});
    ASSERT_EQ(result.exit_code, 0) << name << ": " << result.err;
    for (const auto& part : {"verifying on 64 example inputs from " + user_model(name).examples.string(),
                             std::string("before (original"), std::string("after (bf16"), std::string("batch 64:")}) {
      EXPECT_TRUE(Contains(result.out, part)) << name;
    }
  }
  auto tuple = optimize("two_outputs_scripted", {"--example-inputs", user_model("two_outputs_scripted").examples.string(),
                                                 "--measure-seconds", "0"});
  ASSERT_EQ(tuple.exit_code, 0) << tuple.err;
  for (const auto* part : {"agreement (worst of 2 outputs): max abs diff", "  output 0: max abs diff",
                           "  output 1: max abs diff"}) {
    EXPECT_TRUE(Contains(tuple.out, part));
  }
}

TEST_F(DifferentialCli, OptimizeSaysWhichInputsAModelNeeds) {
  const auto two_inputs = user_model("two_inputs_scripted").file.string();
  auto without = optimize("two_inputs_scripted", {});
  EXPECT_EQ(without.exit_code, 2);
  EXPECT_TRUE(one_error_line(without, {two_inputs + "'s forward takes 2 inputs (image, features)", "example inputs"}));

  auto tokens = optimize("embedding_scripted", {"--input-shape", "6"});
  EXPECT_EQ(tokens.exit_code, 1);
  EXPECT_TRUE(one_error_line(tokens, {user_model("embedding_scripted").file.string() +
                                          ": the model fails on 512 random inputs: Expected tensor for argument #1 "
                                          "'indices' to have one of the following scalar types: Long, Int",
                                      "file of example inputs"}));

  const auto one_tensor = user_model("embedding_scripted").examples.string();
  auto wrong_count = optimize("two_inputs_scripted", {"--example-inputs", one_tensor});
  EXPECT_EQ(wrong_count.exit_code, 1);
  EXPECT_TRUE(one_error_line(wrong_count, {one_tensor + ": holds 1 example inputs, " + two_inputs +
                                               "'s forward takes 2 (image, features)"}));

  write_file(dir_ / "not-tensors.pt", "not a torch.save file");
  auto garbage = optimize("cnn_scripted", {"--example-inputs", (dir_ / "not-tensors.pt").string()});
  EXPECT_EQ(garbage.exit_code, 1);
  EXPECT_TRUE(one_error_line(garbage, {(dir_ / "not-tensors.pt").string() + ": not a file of tensors"}));

  auto both = optimize("cnn_scripted", {"--example-inputs", one_tensor, "--input-shape", "1,28,28"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_TRUE(Contains(both.err, "--input-shape excludes --example-inputs"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out.pt"));
}

}  // namespace
}  // namespace afterburner::testing
