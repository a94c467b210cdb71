#include "afterburner/data/loader.h"

#include <fmt/format.h>

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/core/memory_format.h"
#include "random.h"

namespace afterburner::data {

struct EpochPlan {
  int64_t epoch;
  torch::Tensor order;      // sample indices, batch b is order[b * batch_size, ...)
  uint64_t transform_seed;  // batch b's transform draws from derive_seed(transform_seed, b)
  int64_t first_batch, end_batch;
};

namespace {

int64_t batches_in(int64_t samples, const LoaderOptions& options) {
  const int64_t batch = options.batch_size();
  return options.drop_last() ? samples / batch : (samples + batch - 1) / batch;
}

// Fisher-Yates; the swap partner of position i is drawn from derive_seed(seed, i).
torch::Tensor shuffled_order(int64_t size, uint64_t seed) {
  torch::Tensor order = torch::arange(size, torch::kLong);
  int64_t* values = order.data_ptr<int64_t>();
  for (int64_t i = size - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(bounded(derive_seed(seed, i), static_cast<uint64_t>(i + 1)));
    std::swap(values[i], values[j]);
  }
  return order;
}

// Each shard's sample count: the uneven tail padded, or dropped.
int64_t samples_per_shard(int64_t size, const Shard& shard) {
  return shard.drop_uneven() ? size / shard.count() : (size + shard.count() - 1) / shard.count();
}

void check_shard(const Shard& shard) {
  if (shard.count() < 1 || shard.rank() < 0 || shard.rank() >= shard.count()) {
    throw UsageError("shard", fmt::format("rank {} is outside {} shards", shard.rank(), shard.count()));
  }
}

}  // namespace

torch::Tensor block_local_order(const torch::Tensor& blocks, int64_t window, uint64_t seed) {
  if (window < 1) throw UsageError("block_window", fmt::format("{} is not positive", window));
  // The samples grouped by block (in sample order within one), and where each block's start.
  const torch::Tensor by_block = std::get<1>(blocks.to(torch::kLong).sort(c10::optional<bool>(true), /*dim=*/0));
  const torch::Tensor counts = std::get<2>(torch::unique_consecutive(blocks.index_select(0, by_block), false, true));
  const torch::Tensor starts = (counts.cumsum(0) - counts).contiguous();
  const int64_t* sample = by_block.data_ptr<int64_t>();
  const int64_t* start = starts.data_ptr<int64_t>();
  const int64_t* count = counts.data_ptr<int64_t>();
  const torch::Tensor block_order = shuffled_order(counts.size(0), derive_seed(seed, 0));
  const int64_t* block = block_order.data_ptr<int64_t>();
  torch::Tensor order = torch::empty({blocks.size(0)}, torch::kLong);
  int64_t* out = order.data_ptr<int64_t>();
  int64_t done = 0;
  std::vector<int64_t> gathered;
  for (int64_t first = 0; first < block_order.size(0); first += window) {
    gathered.clear();
    for (int64_t b = first; b < std::min(first + window, block_order.size(0)); ++b) {
      gathered.insert(gathered.end(), sample + start[block[b]], sample + start[block[b]] + count[block[b]]);
    }
    const torch::Tensor within = shuffled_order(static_cast<int64_t>(gathered.size()),
                                                derive_seed(seed, 1 + static_cast<uint64_t>(first)));
    for (int64_t i = 0; i < within.size(0); ++i) out[done++] = gathered[within.data_ptr<int64_t>()[i]];
  }
  return order;
}

torch::Tensor sharded_order(int64_t size, const Shard& shard, bool shuffle, uint64_t seed, int64_t epoch) {
  torch::Tensor order = torch::arange(size, torch::kLong);
  if (shuffle) order = torch::randperm(size, at::detail::createCPUGenerator(seed + static_cast<uint64_t>(epoch)), torch::kLong);
  return shard_of(order, shard);
}

torch::Tensor shard_of(torch::Tensor order, const Shard& shard) {
  check_shard(shard);
  const int64_t size = order.size(0), count = shard.count();
  const int64_t total = samples_per_shard(size, shard) * count;
  if (total > size && size > 0) {
    // DistributedSampler pads with the order's start, repeated as often as the padding needs.
    order = torch::cat({order, order.repeat({(total - size + size - 1) / size}).slice(0, 0, total - size)});
  }
  return order.slice(/*dim=*/0, /*start=*/shard.rank(), /*end=*/total, /*step=*/count).contiguous();
}

// The dataset, options and transform, plus the worker pool filling a window of
// prefetch * workers batch slots ahead of the consumer.
class LoaderCore {
 public:
  LoaderCore(DatasetPtr dataset, const LoaderOptions& options, TransformPtr transform)
      : dataset_(std::move(dataset)),
        options_(options),
        transform_(std::move(transform)),
        slots_(options.prefetch() * std::max(options.workers(), 1)) {
    try {
      for (int w = 0; w < options_.workers(); ++w) workers_.emplace_back([this] { work(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~LoaderCore() { stop(); }

  int64_t batches_per_epoch() const { return batches_in(samples_per_epoch(), options_); }

  // Makes `epoch` the active one, superseding any other.
  std::shared_ptr<const EpochPlan> start(int64_t epoch, int64_t start_batch) {
    const uint64_t epoch_seed = derive_seed(options_.seed(), static_cast<uint64_t>(epoch));
    auto plan = std::make_shared<const EpochPlan>(EpochPlan{epoch, order_of(epoch, epoch_seed), transform_seed_of(epoch_seed),
                                                            start_batch, batches_per_epoch()});
    std::lock_guard<std::mutex> lock(mutex_);
    activate(plan);
    return plan;
  }

  void finish(const EpochPlan& plan) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_.get() == &plan) activate(nullptr);
  }

  Batch take(const EpochPlan& plan, int64_t batch) {
    if (workers_.empty()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        check_active(plan);
      }
      return build(plan, batch);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    Slot& slot = slot_of(batch);
    batch_ready_.wait(lock, [&] { return stopping_ || active_.get() != &plan || slot.batch == batch; });
    check_active(plan);
    Slot taken = std::move(slot);
    slot = Slot();
    next_take_ = batch + 1;
    lock.unlock();
    work_ready_.notify_all();
    if (taken.error) std::rethrow_exception(taken.error);
    return std::move(*taken.value);
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    batch_ready_.notify_all();
    for (auto& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
  }

 private:
  struct Slot {
    int64_t batch = -1;  // which batch the slot holds, -1 while empty
    std::optional<Batch> value;
    std::exception_ptr error;
  };

  int64_t samples_per_epoch() const {
    const int64_t size = dataset_->size();
    return options_.shard() ? samples_per_shard(size, *options_.shard()) : size;
  }

  torch::Tensor order_of(int64_t epoch, uint64_t epoch_seed) const {
    const int64_t size = dataset_->size();
    const torch::Tensor blocks = options_.block_local() && options_.shuffle() ? dataset_->storage_blocks() : torch::Tensor();
    if (blocks.defined()) {  // the same order on every rank: their shards read the same window of blocks
      const torch::Tensor order = block_local_order(blocks, options_.block_window(), derive_seed(epoch_seed, 0));
      return options_.shard() ? shard_of(order, *options_.shard()) : order;
    }
    if (options_.shard()) return sharded_order(size, *options_.shard(), options_.shuffle(), options_.seed(), epoch);
    if (!options_.shuffle()) return torch::arange(size, torch::kLong);
    return shuffled_order(size, derive_seed(epoch_seed, 0));
  }

  // Each rank's augmentation draws its own numbers.
  uint64_t transform_seed_of(uint64_t epoch_seed) const {
    const int64_t rank = options_.shard() ? options_.shard()->rank() : 0;
    return rank == 0 ? derive_seed(epoch_seed, 1) : derive_seed(derive_seed(epoch_seed, 1), static_cast<uint64_t>(rank));
  }

  Slot& slot_of(int64_t batch) { return slots_[batch % static_cast<int64_t>(slots_.size())]; }

  // Requires the lock.
  void check_active(const EpochPlan& plan) const {
    if (stopping_) throw UsageError("loader", "was destroyed while an epoch was iterated");
    if (active_.get() != &plan) {
      throw UsageError("epoch", fmt::format("epoch {} was superseded by a later Loader::epoch call", plan.epoch));
    }
  }

  // Requires the lock.
  void activate(std::shared_ptr<const EpochPlan> plan) {
    active_ = std::move(plan);
    for (auto& slot : slots_) slot = Slot();
    next_claim_ = next_take_ = active_ ? active_->first_batch : 0;
    work_ready_.notify_all();
    batch_ready_.notify_all();
  }

  // Requires the lock.
  bool can_claim() const {
    return active_ && next_claim_ < active_->end_batch &&
           next_claim_ < next_take_ + static_cast<int64_t>(slots_.size());
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      work_ready_.wait(lock, [&] { return stopping_ || can_claim(); });
      if (stopping_) return;
      std::shared_ptr<const EpochPlan> plan = active_;
      Slot done;
      done.batch = next_claim_++;
      lock.unlock();
      try {
        done.value = build(*plan, done.batch);
      } catch (...) {
        done.error = std::current_exception();
      }
      lock.lock();
      // A superseded or abandoned epoch's batch is dropped.
      if (active_ == plan) {
        slot_of(done.batch) = std::move(done);
        batch_ready_.notify_all();
      }
    }
  }

  // Gather, transform, lay out: a pure function of (plan, batch).
  Batch build(const EpochPlan& plan, int64_t batch_index) const {
    const int64_t first = batch_index * options_.batch_size();
    const int64_t count = std::min(options_.batch_size(), dataset_->size() - first);
    Batch batch = dataset_->get_batch(plan.order.narrow(0, first, count));
    if (transform_) batch = (*transform_)(std::move(batch), derive_seed(plan.transform_seed, batch_index));
    // Batches a transform wrote channels_last (decode_images) stay so: reordering them back would
    // cost a pass for nothing.
    const bool written_channels_last =
        !batch.input.is_contiguous() && batch.input.is_contiguous(at::MemoryFormat::ChannelsLast);
    const bool channels_last = options_.channels_last() && batch.input.dim() == 4;
    if (!written_channels_last) {
      batch.input = channels_last ? afterburner::channels_last(batch.input) : batch.input.contiguous();
    }
    batch.target = batch.target.contiguous();
    return batch;
  }

  const DatasetPtr dataset_;
  const LoaderOptions options_;
  const TransformPtr transform_;

  std::mutex mutex_;
  std::condition_variable work_ready_, batch_ready_;
  std::shared_ptr<const EpochPlan> active_;
  int64_t next_claim_ = 0;  // the next batch a worker builds
  int64_t next_take_ = 0;   // the next batch the consumer takes
  std::vector<Slot> slots_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

EpochRange::EpochRange(std::shared_ptr<LoaderCore> core, std::shared_ptr<const EpochPlan> plan)
    : core_(std::move(core)), plan_(std::move(plan)), next_batch_(plan_->first_batch) {}

EpochRange::EpochRange(EpochRange&& other) noexcept
    : core_(std::move(other.core_)),
      plan_(std::move(other.plan_)),
      next_batch_(other.next_batch_),
      started_(other.started_),
      finished_(other.finished_),
      current_(std::move(other.current_)) {}

EpochRange::~EpochRange() {
  if (core_) core_->finish(*plan_);
}

EpochRange::Iterator EpochRange::begin() {
  if (started_) throw UsageError("epoch", "an EpochRange can be iterated only once");
  started_ = true;
  advance();
  return Iterator(this);
}

void EpochRange::advance() {
  if (next_batch_ >= plan_->end_batch) {
    finished_ = true;
    current_ = Batch();
    core_->finish(*plan_);
    return;
  }
  try {
    current_ = core_->take(*plan_, next_batch_);
  } catch (...) {
    // A batch that failed to load ends the epoch rather than leaving a hole in it.
    finished_ = true;
    core_->finish(*plan_);
    throw;
  }
  ++next_batch_;
}

Loader::Loader(DatasetPtr dataset, LoaderOptions options, TransformPtr transform) : options_(std::move(options)) {
  if (!dataset) throw UsageError("dataset", "is null");
  if (options_.batch_size() < 1) throw UsageError("batch_size", fmt::format("{} is not positive", options_.batch_size()));
  if (options_.workers() < 0) throw UsageError("workers", fmt::format("{} is negative", options_.workers()));
  if (options_.prefetch() < 1) throw UsageError("prefetch", fmt::format("{} is not positive", options_.prefetch()));
  if (options_.shard()) check_shard(*options_.shard());
  const int64_t samples = options_.shard() ? samples_per_shard(dataset->size(), *options_.shard()) : dataset->size();
  if (batches_in(samples, options_) == 0) {
    throw UsageError("batch_size", fmt::format("{} with {} samples{} gives no batch per epoch", options_.batch_size(),
                                               samples, options_.drop_last() ? " and drop_last" : ""));
  }
  core_ = std::make_shared<LoaderCore>(std::move(dataset), options_, std::move(transform));
}

Loader::~Loader() { core_->stop(); }

int64_t Loader::batches_per_epoch() const { return core_->batches_per_epoch(); }

EpochRange Loader::epoch(int64_t epoch, int64_t start_batch) {
  if (epoch < 0) throw UsageError("epoch", fmt::format("{} is negative", epoch));
  if (start_batch < 0 || start_batch > batches_per_epoch()) {
    throw UsageError("start_batch", fmt::format("{} is outside [0, {}]", start_batch, batches_per_epoch()));
  }
  return EpochRange(core_, core_->start(epoch, start_batch));
}

namespace {

// Samples per second over `duration`, timed from the first batch on so thread start-up and
// the first fill of the prefetch window do not count.
double loader_throughput(const DatasetPtr& dataset, const LoaderOptions& options, const TransformPtr& transform,
                         std::chrono::nanoseconds duration) {
  using Clock = std::chrono::steady_clock;
  Loader loader(dataset, options, transform);
  std::optional<Clock::time_point> start;
  int64_t samples = 0;
  for (int64_t epoch = 0;; ++epoch) {
    for (Batch& batch : loader.epoch(epoch)) {
      const auto now = Clock::now();
      if (!start) {
        start = now;
        continue;
      }
      samples += batch.input.size(0);
      const std::chrono::duration<double> elapsed = now - *start;
      if (elapsed >= duration) return samples / elapsed.count();
    }
  }
}

}  // namespace

int choose_workers(DatasetPtr dataset, LoaderOptions options, TransformPtr transform,
                   std::chrono::milliseconds budget) {
  if (budget.count() <= 0) throw UsageError("budget", fmt::format("{} ms is not positive", budget.count()));
  const int most = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto share = std::chrono::duration_cast<std::chrono::nanoseconds>(budget) / (most + 1);
  int best = 0;
  double best_rate = -1;
  for (int workers = 0; workers <= most; ++workers) {
    const double rate = loader_throughput(dataset, options.workers(workers), transform, share);
    if (rate > best_rate) {
      best = workers;
      best_rate = rate;
    }
  }
  return best;
}

}  // namespace afterburner::data
