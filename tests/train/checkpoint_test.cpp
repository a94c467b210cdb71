#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>
#include <zlib.h>

#include <csignal>

#include "afterburner/core/error.h"
#include "afterburner/models/zoo.h"
#include "afterburner/train/checkpoint.h"
#include "afterburner/train/optim.h"
#include "testing.h"

namespace afterburner::train {
namespace {

struct TrainingRun {
  std::string name;
  torch::nn::Sequential model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  GradScaler scaler{GradScalerOptions().init_scale(512)};

  explicit TrainingRun(std::string model_name, uint64_t seed = 0) : name(std::move(model_name)) {
    torch::manual_seed(seed);
    model = models::make_model(name);
    optimizer = make_optimizer(OptimizerOptions().kind("adamw").lr(1e-3), model->parameters());
  }
  // One real step so the optimizer has state (AdamW moments) worth restoring.
  void step() {
    model->zero_grad();
    model->forward(torch::randn({4, 1, 28, 28})).sum().backward();
    optimizer->step();
  }
  CheckpointTarget target(TrainState state = {}) { return {name, model, *optimizer, scaler, state}; }
};

std::string error_of(const std::function<void()>& action) {
  return testing::error_message<CheckpointError>(action);
}

}  // namespace

TEST(Checkpoint, RoundTripRestoresModelOptimizerScalerRngAndState) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun saved("mlp", 1);
  saved.step();
  saved.scaler.update();
  save_checkpoint(path, saved.target({3, 1234, 56, 78.5}));
  auto next_random = torch::rand({4});

  TrainingRun restored("mlp", 2);  // other initial weights and an empty optimizer
  TrainState state = load_checkpoint(path, restored.target());
  EXPECT_EQ(state.epoch, 3);
  EXPECT_EQ(state.step, 1234);
  EXPECT_EQ(state.batch_in_epoch, 56);
  EXPECT_DOUBLE_EQ(state.train_seconds, 78.5);
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_random)) << "RNG state not restored";
  auto a = saved.model->parameters(), b = restored.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  EXPECT_EQ(restored.scaler.current_scale(), saved.scaler.current_scale());
  EXPECT_EQ(restored.scaler.growth_tracker(), 1);
  // Same optimizer state: one more identical step keeps the weights identical.
  torch::manual_seed(9);
  saved.step();
  torch::manual_seed(9);
  restored.step();
  a = saved.model->parameters(), b = restored.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

TEST(Checkpoint, MissingFileIsAnError) {
  TrainingRun run("mlp");
  auto message = error_of([&] { load_checkpoint("/nonexistent/ckpt.pt", run.target()); });
  EXPECT_NE(message.find("/nonexistent/ckpt.pt"), std::string::npos) << message;
}

TEST(Checkpoint, CorruptOrTruncatedFileIsAnErrorNamingIt) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun run("mlp");
  save_checkpoint(path, run.target());
  std::string bytes = testing::read_file(path);
  for (std::string broken : {bytes.substr(0, bytes.size() / 2), std::string("not a checkpoint at all")}) {
    testing::write_file(path, broken);
    auto message = error_of([&] { load_checkpoint(path, run.target()); });
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(Checkpoint, FlippedByteIsRefusedBeforeLibTorchParsesIt) {
  // LibTorch's zip reader does not check CRC-32s: a flipped byte in the archive's code record
  // reached its TorchScript parser, which crashed (found by fuzzing). Flip one byte of every
  // record in turn: each is named, and nothing reaches LibTorch.
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun run("mlp");
  save_checkpoint(path, run.target());
  const std::string bytes = testing::read_file(path);
  for (const std::string record : {"archive/code/", "archive/data.pkl", "archive/data/0"}) {
    // A record's bytes follow its local header: the 30-byte header, then its name and extra field.
    const auto header = bytes.find(record);
    ASSERT_NE(header, std::string::npos) << record;
    const auto name_length = static_cast<unsigned char>(bytes[header - 4]) | static_cast<unsigned char>(bytes[header - 3]) << 8;
    const auto extra_length = static_cast<unsigned char>(bytes[header - 2]) | static_cast<unsigned char>(bytes[header - 1]) << 8;
    std::string flipped = bytes;
    flipped[header + name_length + extra_length] ^= 0x20;
    testing::write_file(path, flipped);
    auto message = error_of([&] { load_checkpoint(path, run.target()); });
    EXPECT_NE(message.find(path + ": not a readable checkpoint (record " + record), std::string::npos) << message;
    // A stored record fails its CRC; a deflated one (the code) may fail to inflate first.
    const bool stored = record != "archive/code/";
    if (stored) {
      EXPECT_NE(message.find("fails its CRC-32 check"), std::string::npos) << message;
    }
  }
}

// Writes `value` little-endian into 4 bytes of `bytes` at `at`.
void put_u32(std::string& bytes, std::size_t at, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(value >> (8 * i));
}

uint16_t get_u16(const std::string& bytes, std::size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(bytes[at]) | static_cast<unsigned char>(bytes[at + 1]) << 8);
}

uint32_t get_u32(const std::string& bytes, std::size_t at) {
  return get_u16(bytes, at) | static_cast<uint32_t>(get_u16(bytes, at + 2)) << 16;
}

TEST(Checkpoint, RecordDeclaringMoreBytesThanItHoldsIsRefused) {
  // Found by fuzzing: a compressed record whose central directory entry promises 3 GB (its CRC
  // still right) made LibTorch allocate 3 GB before reading it. The entry: name at +46, size at +24.
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun run("mlp");
  save_checkpoint(path, run.target());
  std::string bytes = testing::read_file(path);
  const std::string record = "archive/code/__torch__.py";
  int patched = 0;
  for (auto at = bytes.find(record); at != std::string::npos; at = bytes.find(record, at + 1)) {
    if (at >= 46 && bytes.compare(at - 46, 4, "PK\x01\x02") == 0 && get_u16(bytes, at - 18) == record.size()) {
      put_u32(bytes, at - 22, 3000000000u);
      ++patched;
    }
  }
  ASSERT_EQ(patched, 1) << "the record's central directory entry was not found";
  testing::write_file(path, bytes);
  auto message = error_of([&] { load_checkpoint(path, run.target()); });
  EXPECT_NE(message.find(path + ": not a readable checkpoint (record " + record + " declares 3000000000 bytes but holds"),
            std::string::npos) << message;
}

TEST(Checkpoint, GarbageCodeWithRightCrcIsAnError) {
  // Found by fuzzing (the fuzzer learns CRC-32s from its comparisons): a stored code record
  // overwritten with garbage and given its right CRC-32 passes the archive check, and
  // LibTorch's TorchScript lexer throws a std::runtime_error, not a c10::Error.
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun run("mlp");
  save_checkpoint(path, run.target());
  std::string bytes = testing::read_file(path);
  int patched = 0;
  // Central directory entries: method at +10, CRC at +16, size at +20, name length at +28,
  // local header offset at +42, name at +46. LibTorch writes the CRC and sizes in data
  // descriptors after the data, not in local headers; libzip checks the central directory's.
  for (auto entry = bytes.find("PK\x01\x02"); entry != std::string::npos && patched == 0;
       entry = bytes.find("PK\x01\x02", entry + 4)) {
    const std::string name = bytes.substr(entry + 46, get_u16(bytes, entry + 28));
    const bool stored_code = get_u16(bytes, entry + 10) == 0 && name.rfind("archive/code/", 0) == 0 &&
                             name.compare(name.size() - 3, 3, ".py") == 0;
    if (!stored_code) continue;
    const uint32_t size = get_u32(bytes, entry + 20);
    const uint32_t local = get_u32(bytes, entry + 42);
    const std::size_t data = local + 30 + get_u16(bytes, local + 26) + get_u16(bytes, local + 28);
    std::fill_n(bytes.begin() + static_cast<std::ptrdiff_t>(data), size, '\xbe');
    const auto crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + data), size));
    put_u32(bytes, entry + 16, crc);
    if (bytes.compare(data + size, 4, "PK\x07\x08") == 0) put_u32(bytes, data + size + 4, crc);
    ++patched;
  }
  ASSERT_EQ(patched, 1) << "no stored code record in the checkpoint";
  testing::write_file(path, bytes);
  auto message = error_of([&] { load_checkpoint(path, run.target()); });
  EXPECT_NE(message.find(path + ": not a readable checkpoint (expected a valid token"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(Checkpoint, AnotherModelsCheckpointIsRefused) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun cnn("cnn");
  save_checkpoint(path, cnn.target());
  TrainingRun mlp("mlp");
  auto message = error_of([&] { load_checkpoint(path, mlp.target()); });
  EXPECT_NE(message.find("'cnn'"), std::string::npos) << message;
  EXPECT_NE(message.find("'mlp'"), std::string::npos) << message;
}

TEST(Checkpoint, SameNameWithOtherShapesIsRefused) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun ten("mlp");
  save_checkpoint(path, ten.target());
  TrainingRun three("mlp");
  three.model = models::make_model("mlp", models::ModelOptions().num_classes(3));
  three.optimizer = make_optimizer(OptimizerOptions(), three.model->parameters());
  auto message = error_of([&] { load_checkpoint(path, three.target()); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
}

// A full disk mid-write (simulated with a file size limit) keeps the previous checkpoint.
TEST(Checkpoint, FailedWriteKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  auto path = (dir / "ckpt.pt").string();
  TrainingRun run("mlp");
  save_checkpoint(path, run.target({0, 1, 0, 0}));
  std::string before = testing::read_file(path);

  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;  // far below the mlp's 7 MB of weights
  setrlimit(RLIMIT_FSIZE, &small);
  auto message = error_of([&] { save_checkpoint(path, run.target({0, 2, 0, 0})); });
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_EQ(testing::read_file(path), before) << "the previous checkpoint changed";
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1) << "a temporary file was left behind";
  EXPECT_EQ(load_checkpoint(path, run.target()).step, 1);
}

}  // namespace afterburner::train
