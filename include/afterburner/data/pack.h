// .abpk packs: an image folder's images and labels in one file that the loader memory-maps, so
// that an epoch reads one mapping instead of opening thousands of files, and (with max_side or
// raw) decodes smaller images or none at all.
//
//   pack_image_folder("pets/train", "train.abpk", PackOptions().max_side(256));   // resumable
//   auto train = std::make_shared<PackedImages>("train.abpk");
//   Loader loader(train, LoaderOptions().batch_size(64).workers(2),
//                 decode_images(train, DecodeOptions().size(224)));        // as an image folder
//
// Layout (little-endian): a 4 KiB header page; the records, each a 32-byte header (magic, source
// index, label, format, channels, width, height, payload size, payload CRC-32) and its payload,
// packed into 4 MiB blocks that no record crosses unless it is larger than a block (it then
// starts one); the index (32 bytes per record: offset and the header's fields), then the class
// names. The header page names the pack's version, record count, sections and options and ends
// in its own CRC-32. While packing, the file is `<output>.partial` and its header page says so
// and what it packs; a later run with the same source and options resumes after its last whole
// record.
#pragma once

#include <torch/arg.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/image_records.h"

namespace afterburner::data {

struct PackOptions {
  // Images whose longer side exceeds it are resized to it (antialiased, as the pipeline resamples)
  // and stored re-encoded; 0 keeps every image as stored: a JPEG or PNG's own bytes.
  TORCH_ARG(int64_t, max_side) = 0;
  // The JPEG quality of re-encoded images (1-100).
  TORCH_ARG(int64_t, quality) = 90;
  // Store decoded pixels instead (no decoding when training; about 10x the bytes of a JPEG).
  TORCH_ARG(bool, raw) = false;
  // The class names the folder's subfolders are labelled by (a validation folder packed with its
  // training pack's classes); empty: the sorted subfolder names.
  TORCH_ARG(std::vector<std::string>, classes);
  // Where corrupt images and empty class folders are recorded and left out (null: an error).
  TORCH_ARG(std::shared_ptr<SkippedInputs>, skipped);
};

struct PackSummary {
  int64_t records = 0;  // in the pack
  int64_t resumed = 0;  // of them, found whole in a `.partial` file from an earlier run
  int64_t bytes = 0;    // the pack's size
};

// Packs the image folder `source` (image_folder.h's layout and rules) into `output`. `progress`,
// when given, is called with the number of source images done and their total. Throws DataError
// naming the source file or the output.
PackSummary pack_image_folder(const std::string& source, const std::string& output,
                              const PackOptions& options = PackOptions(),
                              const std::function<void(int64_t, int64_t)>& progress = nullptr);

// A finished pack, memory-mapped read-only: each record's bytes are read from the mapping (and
// checked against their CRC-32 the first time). Throws DataError naming the file when it is not
// a pack, an unfinished one, or damaged (a section out of bounds, a record outside the data, a
// label outside the classes, a header that fails its CRC).
class PackedImages : public ImageRecords {
 public:
  explicit PackedImages(const std::string& path);
  ~PackedImages() override;
  PackedImages(const PackedImages&) = delete;
  PackedImages& operator=(const PackedImages&) = delete;

  int64_t size() const override;
  Record record(int64_t index, std::vector<char>& scratch) const override;
  std::string source(int64_t index) const override;
  const std::vector<int64_t>& labels() const override { return labels_; }
  torch::Tensor storage_blocks() const override;  // each record's 4 MiB block
  // Whether the pack exceeds half the memory the system has available now: then an exact
  // shuffle would read it from disk at random, and a block-local order (loader.h) reads it a few
  // blocks at a time.
  bool larger_than_memory() const;
  const std::vector<std::string>& classes() const override { return classes_; }
  // "encoded" (each image as stored), "jpeg q90, max side 256" or "raw, max side 256".
  const std::string& describe_storage() const { return storage_; }

 private:
  struct Entry;
  void read_layout();  // the header, index and classes, checked

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<Entry> entries_;
  std::vector<int64_t> labels_;
  std::vector<std::string> classes_;
  std::string storage_;
  std::unique_ptr<std::atomic<bool>[]> checked_;
};

// Whether `path` is a pack (by its name ending in .abpk).
bool is_pack_file(const std::string& path);

}  // namespace afterburner::data
