// Images stored one per sample, with their labels: encoded (JPEG or PNG) or as raw pixels. These
// are the datasets the image readers decode: files of an image folder (ImageFiles) and the records
// of a pack (pack.h). get_batch returns the samples' indices as the input (int64 [n]) and their
// labels, for decode_images (image_pipeline.h) to turn into pixels per epoch, or decode_records
// (image_folder.h) once.
//
//   auto files = std::make_shared<ImageFiles>(list_image_folder("pets/train"));
//   torch::Tensor first = decode_record(*files, 0);      // uint8 [C, H, W]
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "afterburner/data/dataset.h"
#include "afterburner/data/image_file.h"
#include "afterburner/data/image_folder.h"

namespace afterburner::data {

class ImageRecords : public Dataset {
 public:
  struct Record {
    const uint8_t* bytes = nullptr;
    size_t size = 0;
    // Raw pixels: uint8 HWC of height x width x channels (1 or 3). Otherwise a JPEG or PNG.
    bool raw = false;
    int64_t width = 0, height = 0, channels = 0;
  };
  // Record `index`'s bytes: read into `scratch` when they must be read (a file), else pointing into
  // memory the dataset holds for its lifetime. Throws DataError naming source(index).
  virtual Record record(int64_t index, std::vector<char>& scratch) const = 0;
  // Names record `index` in errors: its file, or the pack and the record.
  virtual std::string source(int64_t index) const = 0;
  virtual const std::vector<int64_t>& labels() const = 0;
  virtual const std::vector<std::string>& classes() const = 0;

  Batch get_batch(const torch::Tensor& indices) const override;
};

// An image folder's files (list_image_folder), each read when its sample is.
class ImageFiles : public ImageRecords {
 public:
  explicit ImageFiles(ImageFileList files);
  int64_t size() const override;
  Record record(int64_t index, std::vector<char>& scratch) const override;
  std::string source(int64_t index) const override;
  const std::vector<int64_t>& labels() const override { return files_.labels; }
  const std::vector<std::string>& classes() const override { return files_.classes; }
  const ImageFileList& files() const { return files_; }

 private:
  ImageFileList files_;
};

// Encoded images held in memory (a served request's JPEG or PNG bodies), unlabelled; `name` and
// the image's number (from 1) name each in errors: "request image 2".
class EncodedImages : public ImageRecords {
 public:
  EncodedImages(std::vector<std::string> images, std::string name);
  int64_t size() const override { return static_cast<int64_t>(images_.size()); }
  Record record(int64_t index, std::vector<char>& scratch) const override;
  std::string source(int64_t index) const override;
  const std::vector<int64_t>& labels() const override { return labels_; }
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::vector<std::string> images_;
  std::string name_;
  std::vector<int64_t> labels_;  // zeros
  std::vector<std::string> classes_;
};

// The stored size of a record (of an encoded one, from its header alone; raw ones are never
// decoded in part).
ImageSize record_size(const ImageRecords::Record& record, const std::string& source);

// A record's pixels into `into` as decode_pixels decodes (eighths and region apply to a JPEG;
// raw pixels are copied whole).
void record_pixels(const ImageRecords::Record& record, const std::string& source, int eighths, Pixels& into,
                   const Box* region = nullptr);

// Record `index` decoded whole: uint8 [C, H, W].
torch::Tensor decode_record(const ImageRecords& records, int64_t index);

// Every record decoded into memory: uint8 [N, C, S, S], one channel when all are grayscale, else
// three (grayscale ones repeated, as PIL's convert("RGB")). image_size as
// ImageFolderOptions::image_size. Throws DataError naming the record for a corrupt one (or, with
// `skipped`, records it there and leaves it out) and for (when image_size is 0) images that are
// not squares of one size; `name` names the set when none could be read.
LabelledDataset decode_records(const ImageRecords& records, int64_t image_size, SkippedInputs* skipped,
                               const std::string& name);

}  // namespace afterburner::data
