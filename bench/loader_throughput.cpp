// Samples per second of iterating the Loader over Fashion-MNIST train with the usual
// augmentation (to_float(1/255) -> normalize(0.2860, 0.3530) -> random_crop(2), batch 128),
// for 0, 1 and 2 workers. bench/pytorch_loader.py measures torch.utils.data the same way.
//
//   bench_loader_throughput [--data DIR] [--reps N] [--workers 0,1,2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/data/idx.h"
#include "afterburner/data/loader.h"

namespace {

using namespace afterburner::data;

struct Settings {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int reps = 5;
  std::vector<int> workers{0, 1, 2};
};

Settings parse(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--data") {
      settings.data = value;
    } else if (flag == "--reps") {
      settings.reps = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--workers") {
      settings.workers.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) settings.workers.push_back(std::atoi(item.c_str()));
    } else {
      throw afterburner::UsageError(flag, "unknown flag (use --data, --reps, --workers)");
    }
  }
  return settings;
}

// One full epoch, timed from the request for its first batch to the last batch in hand.
double epoch_samples_per_second(Loader& loader, int64_t epoch) {
  const auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  for (Batch& batch : loader.epoch(epoch)) samples += batch.input.size(0);
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return samples / elapsed.count();
}

}  // namespace

int main(int argc, char** argv) try {
  const Settings settings = parse(argc, argv);
  DatasetPtr train = load_mnist(settings.data, Split::train);
  TransformPtr augment = compose({to_float(1.0 / 255), normalize({0.2860}, {0.3530}), random_crop(2)});
  std::printf("afterburner loader: Fashion-MNIST train, batch 128, %s, %d epochs each\n",
              augment->describe().c_str(), settings.reps);
  for (int workers : settings.workers) {
    Loader loader(train, LoaderOptions().batch_size(128).workers(workers), augment);
    epoch_samples_per_second(loader, 0);  // warm-up: first touches of the dataset and allocator
    std::vector<double> rates;
    for (int rep = 1; rep <= settings.reps; ++rep) rates.push_back(epoch_samples_per_second(loader, rep));
    std::sort(rates.begin(), rates.end());
    const double median = (rates[(rates.size() - 1) / 2] + rates[rates.size() / 2]) / 2;
    std::printf("afterburner workers=%d samples/s median=%.0f min=%.0f max=%.0f\n", workers, median, rates.front(),
                rates.back());
  }
  return 0;
} catch (const afterburner::Error& e) {
  std::fprintf(stderr, "bench_loader_throughput: %s\n", e.what());
  return e.exit_code();
}
