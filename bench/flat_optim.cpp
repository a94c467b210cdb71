// FlatSGD / FlatAdamW against torch::optim::SGD / AdamW on the parameters of the zoo's "cnn"
// ([32,1,3,3] [32] [64,32,3,3] [64] [128,3136] [128] [10,128] [10]) and "mlp" (784-1024-1024-10).
// SGD: lr 0.01, momentum 0.9, weight decay 5e-4; AdamW: lr 1e-3, weight decay 1e-2.
//   1. step() alone, gradients already in place (the flat ones in the flat gradient buffer);
//   2. step() alone after every gradient was replaced by a new tensor, as backward does after
//      Module::zero_grad(true) (the Trainer's choice): the flat optimizers copy them back in;
//   3. a whole iteration (zero_grad, forward, backward on a batch of 128, step) for each way of
//      zeroing, to see which one the Trainer should use.
//
//   bench_flat_optim [--reps N] [--iteration-reps N] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/threads.h"
#include "afterburner/kernels/flat_optim.h"
#include "afterburner/models/zoo.h"

namespace {

using afterburner::kernels::FlatAdamW;
using afterburner::kernels::FlatOptimizer;
using afterburner::kernels::FlatSGD;

struct Settings {
  int reps = 200;
  int iteration_reps = 30;
  int threads = 2;
};

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::max(1, std::atoi(argv[i + 1]));
    if (flag == "--reps") {
      settings.reps = value;
    } else if (flag == "--iteration-reps") {
      settings.iteration_reps = value;
    } else if (flag == "--threads") {
      settings.threads = value;
    } else {
      throw afterburner::UsageError(flag, "unknown flag (use --reps, --iteration-reps, --threads)");
    }
  }
  return settings;
}

enum class Algorithm { sgd, adamw };
const char* name(Algorithm algorithm) { return algorithm == Algorithm::sgd ? "sgd" : "adamw"; }

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Algorithm algorithm, bool flat,
                                                        const std::vector<torch::Tensor>& params) {
  const auto sgd = torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(5e-4);
  const auto adamw = torch::optim::AdamWOptions(1e-3).weight_decay(1e-2);
  if (algorithm == Algorithm::sgd) {
    if (flat) return std::make_unique<FlatSGD>(params, sgd);
    return std::make_unique<torch::optim::SGD>(params, sgd);
  }
  if (flat) return std::make_unique<FlatAdamW>(params, adamw);
  return std::make_unique<torch::optim::AdamW>(params, adamw);
}

struct Stats {
  double median, min, max;  // milliseconds
};

// Runs prepare() then the timed action, 5 times to warm up and `reps` times measured.
Stats time_ms(int reps, const std::function<void()>& prepare, const std::function<void()>& action) {
  std::vector<double> ms;
  for (int rep = -5; rep < reps; ++rep) {
    prepare();
    const auto start = std::chrono::steady_clock::now();
    action();
    const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
    if (rep >= 0) ms.push_back(elapsed.count());
  }
  std::sort(ms.begin(), ms.end());
  return {(ms[(ms.size() - 1) / 2] + ms[ms.size() / 2]) / 2, ms.front(), ms.back()};
}

// step() alone; with `replace_grads` every parameter gets a new gradient tensor before it.
Stats time_step(const std::string& model_name, Algorithm algorithm, bool flat, bool replace_grads, int reps) {
  auto model = afterburner::models::make_model(model_name);
  auto params = model->parameters();
  auto optimizer = make_optimizer(algorithm, flat, params);
  torch::manual_seed(0);
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) grads.push_back(torch::randn(p.sizes()) * 1e-3);
  auto install = [&] {
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i].clone();
  };
  install();
  return time_ms(reps, replace_grads ? std::function<void()>(install) : [] {}, [&] { optimizer->step(); });
}

enum class ZeroGrad { module_set_to_none, flat_buffer };

// zero_grad + forward + backward + step on a batch of 128 Fashion-MNIST-sized images.
Stats time_iteration(const std::string& model_name, Algorithm algorithm, bool flat, ZeroGrad zero_grad, int reps) {
  auto model = afterburner::models::make_model(model_name);
  auto optimizer = make_optimizer(algorithm, flat, model->parameters());
  torch::manual_seed(0);
  const torch::Tensor input = torch::randn({128, 1, 28, 28});
  const torch::Tensor target = torch::randint(0, 10, {128});
  return time_ms(reps, [] {}, [&] {
    if (zero_grad == ZeroGrad::flat_buffer) {
      static_cast<FlatOptimizer&>(*optimizer).zero_grad();
    } else {
      model->zero_grad(/*set_to_none=*/true);
    }
    torch::nn::functional::cross_entropy(model->forward(input), target).backward();
    optimizer->step();
  });
}

void print_row(const std::string& label, const Stats& stats) {
  std::printf("  %-50s median %8.3f  min %8.3f  max %8.3f ms\n", label.c_str(), stats.median, stats.min, stats.max);
}

void compare_steps(const Settings& settings, bool replace_grads) {
  std::printf("\nstep() alone, %s (%d reps):\n",
              replace_grads ? "every gradient replaced by a new tensor before each step"
                            : "gradients in place",
              settings.reps);
  for (const std::string model : {"cnn", "mlp"}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adamw}) {
      const Stats torch_stats = time_step(model, algorithm, false, replace_grads, settings.reps);
      const Stats flat_stats = time_step(model, algorithm, true, replace_grads, settings.reps);
      const std::string label = model + " " + name(algorithm);
      print_row(label + " torch::optim", torch_stats);
      print_row(label + " flat", flat_stats);
      std::printf("  %-50s %.2fx (median torch / median flat)\n", (label + " speed-up").c_str(),
                  torch_stats.median / flat_stats.median);
    }
  }
}

void compare_iterations(const Settings& settings) {
  std::printf("\nwhole iteration: zero_grad, forward, backward (batch 128), step (%d reps):\n",
              settings.iteration_reps);
  for (const std::string model : {"cnn", "mlp"}) {
    for (Algorithm algorithm : {Algorithm::sgd, Algorithm::adamw}) {
      const std::string label = model + " " + name(algorithm);
      print_row(label + " torch::optim, Module::zero_grad(true)",
                time_iteration(model, algorithm, false, ZeroGrad::module_set_to_none, settings.iteration_reps));
      print_row(label + " flat, Module::zero_grad(true)",
                time_iteration(model, algorithm, true, ZeroGrad::module_set_to_none, settings.iteration_reps));
      print_row(label + " flat, FlatOptimizer::zero_grad()",
                time_iteration(model, algorithm, true, ZeroGrad::flat_buffer, settings.iteration_reps));
    }
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const Settings settings = parse(argc, argv);
  afterburner::ThreadsGuard threads(settings.threads);
  std::printf("bench_flat_optim: %d intra-op threads\n", at::get_num_threads());
  compare_steps(settings, /*replace_grads=*/false);
  compare_steps(settings, /*replace_grads=*/true);
  compare_iterations(settings);
  return 0;
} catch (const afterburner::Error& e) {
  std::fprintf(stderr, "bench_flat_optim: %s\n", e.what());
  return e.exit_code();
}
