// afterburner data pack: an image folder packed into one .abpk file (data/pack.h) that
// `afterburner train --data` memory-maps, its images kept as stored, resized and re-encoded, or
// decoded (--raw). Resumable: a run stopped part-way continues where it stopped when run again.
#include <fmt/format.h>

#include <memory>

#include "afterburner/core/threads.h"
#include "afterburner/data/pack.h"
#include "commands.h"

namespace afterburner::tools {
namespace {

struct PackArgs {
  std::string source;
  std::string output;
  std::string classes_from;
  int64_t max_side = 0;
  int64_t quality = 90;
  bool raw = false;
  bool skip_corrupt = false;
};

int run_pack(const PackArgs& args) {
  const ThreadsGuard threads(available_cores());  // images are decoded and encoded in parallel
  data::PackOptions options = data::PackOptions().max_side(args.max_side).quality(args.quality).raw(args.raw);
  if (!args.classes_from.empty()) options.classes(data::PackedImages(args.classes_from).classes());
  if (args.skip_corrupt) options.skipped(std::make_shared<data::SkippedInputs>());
  int64_t shown = -1;
  const auto progress = [&shown](int64_t done, int64_t total) {
    const int64_t percent = done * 100 / total;
    if (percent / 10 == shown / 10) return;
    shown = percent;
    fmt::print(stderr, "afterburner: packed {} of {} images\n", done, total);
  };
  const data::PackSummary summary = data::pack_image_folder(args.source, args.output, options, progress);
  for (const std::string& line : options.skipped() ? options.skipped()->lines() : std::vector<std::string>{}) {
    fmt::print(stderr, "afterburner: skipped {}\n", line);
  }
  fmt::print("wrote {}: {} images ({} resumed from an earlier run), {:.1f} MB\n", args.output, summary.records,
             summary.resumed, summary.bytes / 1e6);
  return 0;
}

}  // namespace

Command add_data_command(CLI::App& app) {
  auto* sub = app.add_subcommand("data", "prepare datasets for training");
  sub->require_subcommand(1);
  auto* pack = sub->add_subcommand("pack", "pack a folder of class folders of JPEG/PNG images into one .abpk file "
                                           "that `train --data` memory-maps (run again to resume)");
  auto args = std::make_shared<PackArgs>();
  pack->add_option("source", args->source, "the image folder: one folder of images per class")->required();
  pack->add_option("-o,--output", args->output, "the pack to write (name it *.abpk)")->required();
  pack->add_option("--max-side", args->max_side,
                   "resize images whose longer side exceeds this (antialiased) and store them re-encoded; 0 keeps "
                   "each file's own bytes")
      ->capture_default_str();
  auto* quality = pack->add_option("--quality", args->quality, "JPEG quality of re-encoded images (1-100)")
                      ->capture_default_str();
  pack->add_flag("--raw", args->raw, "store decoded pixels (no decoding when training; about 10x the bytes)")
      ->excludes(quality);
  pack->add_option("--classes-from", args->classes_from,
                   "label the class folders by this pack's classes (a validation folder packed for a training pack)");
  pack->add_flag("--skip-corrupt", args->skip_corrupt,
                 "leave out corrupt images and empty class folders, listing them, instead of stopping");
  return {sub, [args] { return run_pack(*args); }};
}

}  // namespace afterburner::tools
