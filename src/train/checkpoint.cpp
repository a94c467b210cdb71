#include "afterburner/train/checkpoint.h"

#include <torch/serialize.h>
#include <torch/torch.h>

#include <filesystem>

#include "afterburner/core/archive.h"
#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"

namespace afterburner::train {
namespace {

const char* const kFormat = "afterburner-checkpoint-2";  // 2: state.samples, state.samples_to_target

void write_archive(const std::string& path, torch::serialize::OutputArchive& archive) {
  try {
    write_file_atomically(path, archive);
  } catch (const FileWriteError& e) {
    throw CheckpointError(path, e.problem());
  }
}

// The model's state in torch::nn::Module::save's layout: a checkpoint of a zoo model reads as
// the same module's own save would.
void write_state(const StateTree& tree, torch::serialize::OutputArchive& archive) {
  for (const auto& [name, parameter] : tree.parameters) archive.write(name, parameter);
  for (const auto& [name, buffer] : tree.buffers) archive.write(name, buffer, /*is_buffer=*/true);
  for (const auto& [name, child] : tree.children) {
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    write_state(child, child_archive);
    archive.write(name, child_archive);
  }
}

// The tensors `archive` holds for `tree`, read but not yet applied; false when one has another
// shape than the model's.
bool read_state(const StateTree& tree, torch::serialize::InputArchive& archive,
                std::vector<std::pair<torch::Tensor, torch::Tensor>>& into) {
  for (const auto& [name, parameter] : tree.parameters) {
    torch::Tensor saved;
    archive.read(name, saved);
    into.emplace_back(parameter, saved);
  }
  for (const auto& [name, buffer] : tree.buffers) {
    torch::Tensor saved;
    archive.read(name, saved, /*is_buffer=*/true);
    into.emplace_back(buffer, saved);
  }
  for (const auto& [name, child] : tree.children) {
    torch::serialize::InputArchive child_archive;
    archive.read(name, child_archive);
    if (!read_state(child, child_archive, into)) return false;
  }
  return std::all_of(into.begin(), into.end(), [](const auto& pair) { return pair.first.sizes() == pair.second.sizes(); });
}

// Module::load swaps each tensor's storage for the file's (Tensor::set_); copying keeps the
// memory that others hold on to (c10d's Reducer, a flat optimizer's buffer) as the parameters'.
bool load_in_place(const Model& model, torch::serialize::InputArchive& archive) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> state;
  if (!read_state(model.state(), archive, state)) return false;
  torch::NoGradGuard no_grad;
  for (auto& [tensor, saved] : state) tensor.copy_(saved);
  return true;
}

torch::Tensor scalar(int64_t v) { return torch::tensor(v, torch::kLong); }
torch::Tensor scalar(double v) { return torch::tensor(v, torch::kDouble); }

// The loop's position and the CPU generator's state (which it restores).
TrainState read_train_state(torch::serialize::InputArchive& archive) {
  torch::Tensor epoch, step, batch, seconds, to_target, samples, samples_to_target, rng;
  archive.read("state.epoch", epoch);
  archive.read("state.step", step);
  archive.read("state.batch_in_epoch", batch);
  archive.read("state.train_seconds", seconds);
  archive.read("state.seconds_to_target", to_target);
  archive.read("state.samples", samples);
  archive.read("state.samples_to_target", samples_to_target);
  archive.read("rng.cpu", rng);
  auto generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  // Absent from checkpoints written before data-parallel training: those were one process's.
  torch::Tensor world_size = scalar(int64_t{1});
  archive.try_read("state.world_size", world_size);
  return {epoch.item<int64_t>(), step.item<int64_t>(), batch.item<int64_t>(), seconds.item<double>(),
          to_target.item<double>(), samples.item<int64_t>(), samples_to_target.item<int64_t>(),
          world_size.item<int64_t>()};
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointTarget& target) {
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(std::string(kFormat)));
  archive.write("model_name", c10::IValue(target.model_name));
  torch::serialize::OutputArchive model, optimizer;
  write_state(target.model.state(), model);
  target.optimizer.save(optimizer);
  archive.write("model", model);
  archive.write("optimizer", optimizer);
  target.scaler.save(archive);
  archive.write("state.epoch", scalar(target.state.epoch));
  archive.write("state.step", scalar(target.state.step));
  archive.write("state.batch_in_epoch", scalar(target.state.batch_in_epoch));
  archive.write("state.train_seconds", scalar(target.state.train_seconds));
  archive.write("state.seconds_to_target", scalar(target.state.seconds_to_target));
  archive.write("state.samples", scalar(target.state.samples));
  archive.write("state.samples_to_target", scalar(target.state.samples_to_target));
  archive.write("state.world_size", scalar(target.state.world_size));
  archive.write("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  write_archive(path, archive);
}

TrainState load_checkpoint(const std::string& path, CheckpointTarget target) {
  if (!std::filesystem::exists(path)) throw CheckpointError(path, "no such checkpoint");
  torch::serialize::InputArchive archive;
  try {
    check_archive(path);
    archive.load_from(path);
  } catch (const ArchiveError& e) {
    throw CheckpointError(path, "not a readable checkpoint (" + e.problem() + ")");
  } catch (const c10::Error& e) {
    throw CheckpointError(path, "not a readable checkpoint (corrupt or truncated file)");
  } catch (const std::exception& e) {  // TorchScript's parser, on a code record that is not code
    throw CheckpointError(path, "not a readable checkpoint (" + first_line(e) + ")");
  }
  c10::IValue format, model_name;
  if (!archive.try_read("format", format) || !format.isString() ||
      format.toStringRef().rfind("afterburner-checkpoint-", 0) != 0) {
    throw CheckpointError(path, "not an afterburner checkpoint");
  }
  if (format.toStringRef() != kFormat) {
    throw CheckpointError(path, "written in format '" + format.toStringRef() + "', which this afterburner (format '" +
                                    kFormat + "') does not read");
  }
  if (!archive.try_read("model_name", model_name) || model_name.toStringRef() != target.model_name) {
    throw CheckpointError(path, "holds model '" + (model_name.isString() ? model_name.toStringRef() : "?") +
                                    "', but this run trains '" + target.model_name + "'");
  }
  TrainState state;
  bool shapes_fit = false;
  try {
    torch::serialize::InputArchive model, optimizer;
    archive.read("model", model);
    archive.read("optimizer", optimizer);
    shapes_fit = load_in_place(target.model, model);
    if (shapes_fit) {
      target.optimizer.load(optimizer);
      target.scaler.load(archive);
      state = read_train_state(archive);
    }
  } catch (const std::exception& e) {  // e.g. an optimizer state that does not fit the parameters
    throw CheckpointError(path, "does not fit this run: " + first_line(e));
  }
  if (!shapes_fit) {
    throw CheckpointError(path, "its tensors have other shapes than this run's model '" + target.model_name + "'");
  }
  return state;
}

}  // namespace afterburner::train
