#include "user_models.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "afterburner/core/error.h"
#include "afterburner/infer/verify.h"
#include "non_finite.h"
#include "testing.h"

namespace afterburner::testing {
namespace fs = std::filesystem;

namespace {

const char* const kPython = "/usr/bin/python3";

fs::path script() { return source_dir() / "tests" / "infer" / "user_models.py"; }

// <build>/tests/test_<area> runs the corpus; the report goes next to <build>/afterburner.
fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path(); }

// ctest -j runs several test processes at once: a reader never sees a half-written file.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".tmp-" + std::to_string(getpid());
  write_file(temporary, text);
  fs::rename(temporary, path);
}

}  // namespace

const std::vector<std::string>& user_model_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const char* base : {"cnn", "residual", "concat", "dense_transition", "two_inputs", "two_outputs", "bn_dropout",
                             "linear_no_bias", "sequence", "embedding", "shared_weights", "token_attention",
                             "token_encoder"}) {
      for (const char* variant : {"scripted", "traced", "flat"}) all.push_back(fmt::format("{}_{}", base, variant));
    }
    return all;
  }();
  return names;
}

const fs::path& user_models_dir() {
  static const TempDir dir;
  static const bool generated = [] {
    const auto result = run({kPython, script().string(), dir.path().string()});
    if (result.exit_code != 0) throw std::runtime_error("user_models.py failed: " + result.out + result.err);
    return true;
  }();
  (void)generated;
  return dir.path();
}

std::vector<std::string> generated_model_names() {
  std::vector<std::string> names;
  std::istringstream lines(read_file(user_models_dir() / "models.txt"));
  for (std::string line; std::getline(lines, line);) names.push_back(line);
  return names;
}

namespace {

// The fixture's tensors <prefix>_input0, _input1, ... and <prefix>_output0, ...
Batch read_batch(const torch::jit::Module& io, const std::string& prefix) {
  Batch tensors;
  for (int i = 0; io.hasattr(fmt::format("{}_input{}", prefix, i)); ++i) {
    tensors.inputs.push_back(io.attr(fmt::format("{}_input{}", prefix, i)).toTensor());
  }
  for (int j = 0; io.hasattr(fmt::format("{}_output{}", prefix, j)); ++j) {
    tensors.outputs.push_back(io.attr(fmt::format("{}_output{}", prefix, j)).toTensor());
  }
  return tensors;
}

}  // namespace

std::map<int64_t, Batch> read_batches(const fs::path& io_file) {
  auto io = torch::jit::load(io_file.string());
  std::map<int64_t, Batch> batches;
  for (int64_t batch : kCorpusBatchSizes) {
    batches[batch] = read_batch(io, fmt::format("batch{}", batch));
    if (batches[batch].inputs.empty() || batches[batch].outputs.empty()) {
      throw std::runtime_error(fmt::format("{}: no inputs or outputs at batch size {}", io_file.string(), batch));
    }
  }
  return batches;
}

std::optional<Batch> read_non_finite_batch(const fs::path& io_file) {
  Batch rows = read_batch(torch::jit::load(io_file.string()), "nonfinite");
  if (rows.inputs.empty()) return std::nullopt;
  return rows;
}

const UserModel& user_model(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, UserModel> models;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = models.find(name);
  if (found != models.end()) return found->second;
  const fs::path& dir = user_models_dir();
  const fs::path fixture = dir / (name + "_io.pt");
  UserModel model{name, dir / (name + ".pt"), dir / (name + "_examples.pt"), read_batches(fixture),
                  read_non_finite_batch(fixture)};
  return models.emplace(name, std::move(model)).first->second;
}

std::vector<std::map<int64_t, Batch>> python_outputs(const std::vector<std::pair<fs::path, fs::path>>& model_and_fixture) {
  TempDir out;
  std::vector<std::string> argv{kPython, script().string(), "--run"};
  std::vector<fs::path> written;
  for (const auto& [model, fixture] : model_and_fixture) {
    written.push_back(out / fmt::format("python_{}.pt", written.size()));
    argv.insert(argv.end(), {model.string(), fixture.string(), written.back().string()});
  }
  const auto result = run(argv);
  if (result.exit_code != 0) throw std::runtime_error("user_models.py --run failed: " + result.out + result.err);
  std::vector<std::map<int64_t, Batch>> outputs;
  for (const auto& file : written) outputs.push_back(read_batches(file));
  return outputs;
}

std::string Tolerance::describe() const {
  std::string text = rtol == 0 ? fmt::format("max abs {:g}", atol) : fmt::format("abs {:g} + rel {:g}", atol, rtol);
  if (min_top1) text += fmt::format(", top-1 >= {:g}%", 100 * *min_top1);
  return text;
}

Runner run_module(torch::jit::Module& module) {
  return [&module](const std::vector<torch::Tensor>& inputs) {
    c10::InferenceMode inference;
    return infer::output_tensors(module.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end())));
  };
}

namespace {

// How one answer compares with Python's.
struct Difference {
  double max_abs = 0;
  int64_t positions = 0;  // argmaxes compared (outputs with classes)
  int64_t agreeing = 0;
  std::string problem;    // empty when within the tolerance

  double top1() const { return positions == 0 ? 1.0 : static_cast<double>(agreeing) / positions; }
  void merge(const Difference& other) {
    max_abs = std::max(max_abs, other.max_abs);
    positions += other.positions;
    agreeing += other.agreeing;
    if (problem.empty()) problem = other.problem;
  }
};

Difference compare(const std::vector<torch::Tensor>& actual, const std::vector<torch::Tensor>& expected,
                   const Tolerance& tolerance) {
  Difference difference;
  if (actual.size() != expected.size()) {
    difference.problem = fmt::format("{} outputs, Python's model returns {}", actual.size(), expected.size());
    difference.max_abs = std::numeric_limits<double>::infinity();
    return difference;
  }
  for (size_t j = 0; j < actual.size(); ++j) {
    if (actual[j].sizes() != expected[j].sizes() || actual[j].scalar_type() != expected[j].scalar_type()) {
      difference.problem = fmt::format("output {} is {} {}, Python's {} {}", j, c10::toString(actual[j].scalar_type()),
                                       c10::str(actual[j].sizes()), c10::toString(expected[j].scalar_type()),
                                       c10::str(expected[j].sizes()));
      difference.max_abs = std::numeric_limits<double>::infinity();
      return difference;
    }
    const auto ours = actual[j].to(torch::kDouble), python = expected[j].to(torch::kDouble);
    const auto gap = (ours - python).abs();
    double max_abs = gap.numel() == 0 ? 0.0 : gap.max().item<double>();
    if (!std::isfinite(max_abs)) max_abs = std::numeric_limits<double>::infinity();
    difference.max_abs = std::max(difference.max_abs, max_abs);
    // NaN compares false: a NaN answer is outside any tolerance.
    const bool close = gap.le(tolerance.atol + tolerance.rtol * python.abs()).all().item<bool>();
    if (!close && difference.problem.empty()) {
      difference.problem = fmt::format("output {}: max abs diff {:.3g} beyond {}", j, max_abs, tolerance.describe());
    }
    if (ours.dim() >= 2 && ours.size(-1) > 1) {
      const auto same = ours.argmax(-1).eq(python.argmax(-1));
      difference.positions += same.numel();
      difference.agreeing += same.sum().item<int64_t>();
    }
  }
  if (tolerance.min_top1 && difference.top1() < *tolerance.min_top1 && difference.problem.empty()) {
    difference.problem = fmt::format("top-1 agreement {:.2f}% below {}", 100 * difference.top1(), tolerance.describe());
  }
  return difference;
}

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t j = 0; j < a.size(); ++j) {
    if (a[j].sizes() != b[j].sizes() || a[j].scalar_type() != b[j].scalar_type() || !torch::equal(a[j], b[j])) {
      return false;
    }
  }
  return true;
}

std::vector<torch::Tensor> cloned(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> copies;
  for (const auto& tensor : tensors) copies.push_back(tensor.clone());
  return copies;
}

// The report's order: models as the corpus lists them, paths as below, then anything else.
const std::vector<std::string> kPathOrder{
    "torch::jit::load",          "infer::load_optimized",        "optimize fp32 -> torch::jit::load",
    "optimize fp32 -> load_optimized", "optimize bf16 -> torch::jit::load", "optimize bf16 -> load_optimized",
    "optimize int8 -> torch::jit::load", "optimize int8 -> load_optimized", "serve JSON", "serve binary",
    "afterburner serve (README config)", "afterburner serve (README config), binary", "sketch -> torch::jit::load",
    "sketch -> load_optimized"};

size_t rank_of(const std::vector<std::string>& order, const std::string& item) {
  return std::find(order.begin(), order.end(), item) - order.begin();
}

// check_non_finite's rows, each after its path's own.
const std::string kNonFiniteRows = ", NaN and inf rows";

size_t path_rank(const std::string& path) {
  const bool non_finite = path.size() > kNonFiniteRows.size() &&
                          path.compare(path.size() - kNonFiniteRows.size(), kNonFiniteRows.size(), kNonFiniteRows) == 0;
  return 2 * rank_of(kPathOrder, non_finite ? path.substr(0, path.size() - kNonFiniteRows.size()) : path) + non_finite;
}

std::string cell(double value) {
  if (value == 0) return "0";
  return std::isinf(value) ? "inf" : fmt::format("{:.1e}", value);
}

// One row per check, tab-separated: model, path, then the markdown cells.
std::mutex rows_mutex;
std::vector<std::string> rows_of_this_test;
std::string rows_test_name;

// A markdown cell on one line of the rows file.
std::string escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') {
      out += "\\|";
    } else {
      out += (c == '\t' || c == '\n') ? ' ' : c;
    }
  }
  return out;
}

void add_row(const std::string& model, const std::string& path, const std::vector<std::string>& cells) {
  std::string line = model + "\t" + path;
  for (const auto& text : cells) line += "\t" + escaped(text);
  std::lock_guard<std::mutex> lock(rows_mutex);
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test_name = test ? fmt::format("{}.{}", test->test_suite_name(), test->name()) : "none";
  std::replace(test_name.begin(), test_name.end(), '/', '_');  // parameterized tests: Suite/Test.Case/param
  if (test_name != rows_test_name) rows_of_this_test.clear();
  rows_test_name = test_name;
  rows_of_this_test.push_back(line);
  // Every test process of the corpus leaves its rows here; write_report() joins them.
  const fs::path dir = build_dir() / "differential";
  fs::create_directories(dir);
  std::string text;
  for (const auto& row : rows_of_this_test) text += row + "\n";
  write_atomically(dir / (test_name + ".rows"), text);
}

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(line);
  while (std::getline(stream, part, separator)) parts.push_back(part);
  return parts;
}

// Prints the report once per process that checked anything, after its last test.
class ReportPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    bool wrote;
    {
      std::lock_guard<std::mutex> lock(rows_mutex);
      wrote = !rows_test_name.empty();
    }
    if (wrote) std::cout << write_report();
  }
};
const auto* const report_printer = ::testing::AddGlobalTestEnvironment(new ReportPrinter);

}  // namespace

PathCheck check_path(const UserModel& model, const std::string& path, const Runner& runner,
                     const Tolerance& tolerance) {
  PathCheck check;
  auto fail = [&check](const std::string& what) {
    if (check.passed) check.failure = what;
    check.passed = false;
  };
  std::map<int64_t, Difference> first_answers;
  Difference after_repeats;
  bool repeated = false;
  std::map<int64_t, std::vector<torch::Tensor>> first;
  std::string changed;
  auto answer = [&](int64_t batch, int call) {
    auto outputs = runner(model.batches.at(batch).inputs);
    if (call == 0) {
      first[batch] = cloned(outputs);
    } else if (changed.empty() && !bitwise_equal(outputs, first.at(batch))) {
      changed = fmt::format("call {} at batch size {} differs from the first by {:.3g}", call + 1, batch,
                            compare(outputs, first.at(batch), kExact).max_abs);
      fail(changed);
    }
    return outputs;
  };
  try {
    for (int64_t batch : kCorpusBatchSizes) {
      first_answers[batch] = compare(answer(batch, 0), model.batches.at(batch).outputs, tolerance);
      if (!first_answers[batch].problem.empty()) fail(fmt::format("batch size {}: {}", batch, first_answers[batch].problem));
    }
    for (int round = 1; round <= kRepeatedCalls; ++round) {
      for (int64_t batch : {1, 2, 7}) answer(batch, round);
    }
    for (int64_t batch : kCorpusBatchSizes) {
      auto last = compare(answer(batch, kRepeatedCalls + 1), model.batches.at(batch).outputs, tolerance);
      if (!last.problem.empty()) fail(fmt::format("after {} calls, batch size {}: {}", kRepeatedCalls, batch, last.problem));
      after_repeats.merge(last);
    }
    repeated = true;
  } catch (const std::exception& e) {
    fail("threw: " + first_line(e));
  }
  std::vector<std::string> cells;
  Difference overall = after_repeats;
  for (int64_t batch : kCorpusBatchSizes) {
    auto found = first_answers.find(batch);
    cells.push_back(found == first_answers.end() ? "-" : cell(found->second.max_abs));
    if (found != first_answers.end()) overall.merge(found->second);
  }
  cells.push_back(repeated ? cell(after_repeats.max_abs) + (changed.empty() ? "" : " (changed)") : "-");
  cells.push_back(tolerance.min_top1 ? fmt::format("{:.1f}%", 100 * overall.top1()) : "");
  cells.push_back(tolerance.describe());
  cells.push_back(check.passed ? "ok" : "**FAIL**: " + check.failure);
  add_row(model.name, path, cells);
  return check;
}

PathCheck check_non_finite(const UserModel& model, const std::string& path, const Runner& runner,
                           const Tolerance& tolerance) {
  PathCheck check;
  if (!model.non_finite) return check;
  auto fail = [&check](const std::string& what) {
    if (check.passed) check.failure = what;
    check.passed = false;
  };
  try {
    const std::vector<torch::Tensor> outputs = runner(model.non_finite->inputs);
    const std::vector<torch::Tensor>& python = model.non_finite->outputs;
    if (outputs.size() != python.size()) fail(fmt::format("{} outputs, Python's model returns {}", outputs.size(), python.size()));
    for (size_t j = 0; j < std::min(outputs.size(), python.size()); ++j) {
      const auto agreement = AgreesWithNonFinite(outputs[j], python[j], tolerance.atol, tolerance.rtol);
      if (!agreement) fail(fmt::format("output {}: {}", j, agreement.message()));
    }
  } catch (const std::exception& e) {
    fail("threw: " + first_line(e));
  }
  add_row(model.name, path + kNonFiniteRows,
          {"-", "-", "-", "-", "-", "", tolerance.describe(), check.passed ? "ok" : "**FAIL**: " + check.failure});
  return check;
}

void report_refusal(const std::string& model, const std::string& path, const std::string& message) {
  add_row(model, path, {"-", "-", "-", "-", "-", "", "", "refused: " + message});
}

std::string write_report() {
  struct Row {
    size_t model_rank, path_rank;
    std::string markdown;
  };
  std::vector<Row> rows;
  const fs::path dir = build_dir() / "differential";
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".rows") continue;
      std::istringstream lines(read_file(entry.path()));
      for (std::string line; std::getline(lines, line);) {
        const auto parts = split(line, '\t');
        if (parts.size() < 2) continue;
        std::string markdown = "|";
        for (const auto& part : parts) markdown += " " + part + " |";
        rows.push_back({rank_of(user_model_names(), parts[0]), path_rank(parts[1]), markdown});
      }
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.model_rank, a.path_rank) < std::tie(b.model_rank, b.path_rank);
  });
  std::string report = fmt::format(
      "# Differential report: afterburner's paths against Python PyTorch\n\n"
      "Models written in Python (tests/infer/user_models.py), run by Python (Debian's python3-torch) and by each "
      "path; "
      "cells are the worst max abs difference over every output element at that batch size; "
      "'after {} calls' is the last answer at every batch size after {} rounds of batch sizes 1, 2 and 7, "
      "'(changed)' if any repeated answer differed bitwise from the first. 'NaN and inf rows': five inputs holding "
      "NaN, +inf and -inf, answered with NaN and infinities where Python has them, the rest within the tolerance. Top-1: argmax agreement over the "
      "last dimension, all batch sizes. No sketch is exact (a layer is sketched only at a rank below half its "
      "smaller side): the sketch rows compare with Python running the same sketched file. Tolerances are argued in "
      "tests/infer/differential_test.cpp. Written by the differential tests "
      "(ctest -R 'Differential|ServedPythonCnn').\n\n"
      "| model | path | batch 1 | batch 2 | batch 7 | batch 64 | after {} calls | top-1 | tolerance | result |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
      kRepeatedCalls, kRepeatedCalls, kRepeatedCalls);
  for (const auto& row : rows) report += row.markdown + "\n";
  write_atomically(build_dir() / "differential-report.md", report);
  return report;
}

}  // namespace afterburner::testing
