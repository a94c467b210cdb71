// Python's TorchScript in, afterburner's optimized model out, and back into Python.
#include <gtest/gtest.h>
#include <torch/script.h>

#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "testing.h"

namespace afterburner::testing {
namespace {

const char* const kDebianPython = "/usr/bin/python3";

std::string export_reference() { return (source_dir() / "bench" / "export_reference.py").string(); }

TEST(PythonInterop, PythonScriptedModelsOptimizeAndAgree) {
  TempDir dir;
  auto exported = run({kDebianPython, export_reference(), "--out", dir.path().string(), "--models", "cnn", "mlp"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  for (const std::string name : {"cnn", "mlp"}) {
    auto io = torch::jit::load((dir / (name + "_io.pt")).string());
    auto input = io.attr("input").toTensor();
    auto expected = io.attr("output").toTensor();
    auto result = infer::optimize(infer::load_model((dir / (name + ".pt")).string()));
    {
      c10::InferenceMode inference;
      EXPECT_TRUE(torch::allclose(result.model.forward({input}).toTensor(), expected, 1e-4, 1e-5)) << name;
    }
    // Python's torch.jit.load runs the optimized file and gets Python's own outputs.
    const auto optimized = dir / (name + "-opt.pt");
    infer::save_model(result.model, optimized.string());
    auto checked = run({kDebianPython, export_reference(), "--check", optimized.string(),
                        (dir / (name + "_io.pt")).string(), "--tolerance", "1e-4"});
    EXPECT_EQ(checked.exit_code, 0) << name << ": " << checked.out << checked.err;
  }
}

TEST(PythonInterop, TorchSaveFilesAreNotTorchScript) {
  TempDir dir;
  const auto path = dir / "state_dict.pt";
  auto saved = run({kDebianPython, "-c", "import sys, torch; torch.save(torch.nn.Linear(2, 2).state_dict(), sys.argv[1])",
                    path.string()});
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  auto message = error_message<infer::ModelError>([&] { infer::load_model(path.string()); });
  EXPECT_TRUE(Contains(message, path.string() + ": not a loadable TorchScript model"));
}

TEST(PythonInterop, PythonLoadsInt8AndBf16Models) {
  TempDir dir;
  auto exported = run({kDebianPython, export_reference(), "--out", dir.path().string(), "--models", "mlp"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  auto model = infer::load_model((dir / "mlp.pt").string());
  auto io = torch::jit::load((dir / "mlp_io.pt").string());
  for (auto precision : {infer::Precision::bf16, infer::Precision::int8}) {
    auto result = infer::optimize(model, infer::OptimizeOptions().precision(precision));
    const auto optimized = dir / ("mlp-" + infer::to_string(precision) + ".pt");
    infer::save_model(result.model, optimized.string());
    // The C++ output of the optimized model as the reference: Python must reproduce it exactly.
    torch::jit::Module fixture("Fixture");
    fixture.register_buffer("input", io.attr("input").toTensor());
    c10::InferenceMode inference;
    fixture.register_buffer("output", result.model.forward({io.attr("input").toTensor()}).toTensor());
    fixture.save((dir / "cpp_io.pt").string());
    auto checked = run({kDebianPython, export_reference(), "--check", optimized.string(), (dir / "cpp_io.pt").string(),
                        "--tolerance", "1e-5"});
    EXPECT_EQ(checked.exit_code, 0) << infer::to_string(precision) << ": " << checked.out << checked.err;
  }
}

}  // namespace
}  // namespace afterburner::testing
