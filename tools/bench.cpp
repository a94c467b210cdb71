// afterburner bench sketch: SKLinear against torch::nn::Linear, for one (terms, rank) or a
// landscape of them, as a table, JSON, CSV and an SVG heatmap.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/core/heap.h"
#include "afterburner/core/threads.h"
#include "afterburner/profile/memory.h"
#include "afterburner/sketch/benchmark.h"
#include "commands.h"
#include "options.h"

namespace afterburner::tools {
namespace {

const std::map<std::string, torch::Dtype> kDtypes{{"fp32", torch::kFloat}, {"bf16", torch::kBFloat16}};

struct SketchBenchArgs {
  int64_t in = 0;
  int64_t out = 0;
  int64_t terms = 1;
  int64_t rank = 16;
  int64_t batch = 64;
  int reps = 20;
  int threads = 0;
  std::string dtype = "fp32";
  bool json = false;
  bool landscape = false;
  std::vector<int64_t> terms_list{1, 2, 4};
  std::vector<int64_t> ranks{8, 16, 32, 64};
  std::string csv;
  std::string svg;
};

std::string ms_text(const sketch::Milliseconds& ms) {
  return fmt::format("{:.3f} [{:.3f}, {:.3f}]", ms.median, ms.min, ms.max);
}

void print_table(const sketch::BenchmarkResult& r) {
  const auto& o = r.options;
  std::cout << fmt::format(
                   "SKLinear({} -> {}, terms {}, rank {}) vs torch::nn::Linear: batch {}, {}, {} threads, "
                   "median [min, max] of {} reps\n",
                   o.in_features(), o.out_features(), o.terms(), o.rank(), o.batch(), sketch::dtype_name(o.dtype()),
                   r.threads, o.reps())
            << fmt::format("{:<22} {:>30} {:>30} {:>9}\n", "", "dense", "sketched", "ratio")
            << fmt::format("{:<22} {:>30} {:>30} {:>8.1f}x\n", "parameters", r.dense.params, r.sketched.params,
                           r.param_ratio())
            << fmt::format("{:<22} {:>30} {:>30}\n", "buffers", r.dense.buffers, r.sketched.buffers)
            << fmt::format("{:<22} {:>30} {:>30}\n", "bytes (params+buffers)", r.dense.bytes, r.sketched.bytes)
            << fmt::format("{:<22} {:>30} {:>30}\n", "step peak tensor bytes", r.dense.step_peak_bytes,
                           r.sketched.step_peak_bytes)
            << fmt::format("{:<22} {:>30} {:>30} {:>8.1f}x\n", "forward FLOPs", r.dense.forward_flops,
                           r.sketched.forward_flops, r.flop_ratio())
            << fmt::format("{:<22} {:>30} {:>30} {:>8.1f}x\n", "forward ms", ms_text(r.dense.forward),
                           ms_text(r.sketched.forward), r.forward_speedup())
            << fmt::format("{:<22} {:>30} {:>30} {:>8.1f}x\n", "forward+backward ms", ms_text(r.dense.forward_backward),
                           ms_text(r.sketched.forward_backward), r.forward_backward_speedup());
}

void print_landscape_row(const sketch::BenchmarkResult& r) {
  std::cout << fmt::format(
                   "{:>5} {:>5} {:>10} {:>7.1f}x {:>7.1f}x {:>10.3f} {:>10.3f} {:>7.1f}x {:>10.3f} {:>10.3f} "
                   "{:>7.1f}x\n",
                   r.options.terms(), r.options.rank(), r.sketched.params, r.param_ratio(), r.flop_ratio(),
                   r.dense.forward.median, r.sketched.forward.median, r.forward_speedup(),
                   r.dense.forward_backward.median, r.sketched.forward_backward.median, r.forward_backward_speedup())
            << std::flush;
}

int run_landscape(const SketchBenchArgs& args, const sketch::BenchmarkOptions& options) {
  if (!args.json) {
    std::cout << fmt::format("SKLinear vs torch::nn::Linear, {} -> {}, batch {}, {}, {} threads; medians in ms\n",
                             args.in, args.out, args.batch, args.dtype, at::get_num_threads())
              << fmt::format("{:>5} {:>5} {:>10} {:>8} {:>8} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}\n", "L", "k",
                             "params", "params/", "FLOPs/", "dense fwd", "sk fwd", "speedup", "dense f+b", "sk f+b",
                             "speedup");
  }
  const auto results = sketch::benchmark_landscape(options, args.terms_list, args.ranks, [&](const auto& result) {
    if (!args.json) print_landscape_row(result);
  });
  if (args.json) {
    nlohmann::json report = nlohmann::json::array();
    for (const auto& result : results) report.push_back(sketch::to_json(result));
    std::cout << report.dump(2) << "\n";
  }
  if (!args.csv.empty()) sketch::write_csv(results, args.csv);
  if (!args.svg.empty()) sketch::write_svg(results, args.svg);
  return 0;
}

int run_sketch_bench(const SketchBenchArgs& args) {
  ThreadsGuard threads(args.threads > 0 ? args.threads : available_cores());
  profile::TensorMemory::install();
  // Both layers allocate the same outputs call after call: keep them in the heap (core/heap.h)
  // rather than page-fault them in anew each repetition.
  keep_freed_memory();
  const auto options = sketch::BenchmarkOptions(args.in, args.out)
                           .terms(args.terms)
                           .rank(args.rank)
                           .batch(args.batch)
                           .reps(args.reps)
                           .dtype(kDtypes.at(args.dtype));
  if (args.landscape) return run_landscape(args, options);
  const auto result = sketch::benchmark_sklinear(options);
  if (args.json) {
    std::cout << sketch::to_json(result).dump(2) << "\n";
  } else {
    print_table(result);
  }
  return 0;
}

// The action of `bench sketch`; the only benchmark so far, so `bench` runs it.
std::function<int()> add_bench_sketch(CLI::App& bench) {
  auto* sub = bench.add_subcommand("sketch", "SKLinear against torch::nn::Linear: time, parameters, FLOPs");
  auto args = std::make_shared<SketchBenchArgs>();
  sub->add_option("--in", args->in, "input features")->required()->check(kPositive);
  sub->add_option("--out", args->out, "output features")->required()->check(kPositive);
  auto* terms =
      sub->add_option("--terms", args->terms, "sketched terms L")->capture_default_str()->check(kPositive);
  auto* rank =
      sub->add_option("--rank", args->rank, "rank k of each term")->capture_default_str()->check(kPositive);
  sub->add_option("--batch", args->batch, "rows per call")->capture_default_str()->check(kPositive);
  sub->add_option("--reps", args->reps, "timed repetitions of each step")
      ->capture_default_str()
      ->check(kPositive);
  sub->add_option("--threads", args->threads, "intra-op threads (default: all available cores)")
      ->check(kPositive);
  sub->add_option("--dtype", args->dtype, "fp32 or bf16, for both layers")
      ->capture_default_str()
      ->check(CLI::IsMember(kDtypes));
  sub->add_flag("--json", args->json, "print the results as JSON");
  auto* landscape = sub->add_flag("--landscape", args->landscape, "sweep --terms-list x --ranks");
  landscape->excludes(terms)->excludes(rank);
  add_list_option(sub, "--terms-list", args->terms_list, "terms L of the landscape")->needs(landscape);
  add_list_option(sub, "--ranks", args->ranks, "ranks k of the landscape")->needs(landscape);
  sub->add_option("--csv", args->csv, "landscape: write one CSV row per (L, k) here")->needs(landscape);
  sub->add_option("--svg", args->svg, "landscape: write a heatmap of the forward speedup here")->needs(landscape);
  return [args] { return run_sketch_bench(*args); };
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks on this machine");
  bench->require_subcommand(1);
  return {bench, add_bench_sketch(*bench)};
}

}  // namespace afterburner::tools
