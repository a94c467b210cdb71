// The data area for the Python package: the threaded Loader as a TorchScript custom class,
// torch.classes.afterburner.Loader (afterburner.data.Loader wraps it), and the IDX and CSV
// readers as ops. Each batch comes out as the tensors the workers built: no copy on the way to Python.
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "afterburner/core/error.h"
#include "afterburner/data/csv.h"
#include "afterburner/data/idx.h"
#include "afterburner/data/image_file.h"
#include "afterburner/data/image_pipeline.h"
#include "afterburner/data/image_transforms.h"
#include "afterburner/data/npy.h"
#include "afterburner/data/pack.h"
#include "afterburner/data/sources.h"
#include "afterburner/data/loader.h"

namespace afterburner::data {
namespace {

// The image chain of transforms.h, as the Python constructor states it: uint8 (or float) input
// scaled by `scale`, normalised when `mean` is given, randomly cropped when `crop_padding` > 0,
// mirrored with probability `flip`. None of them: the batches as the tensors hold them.
TransformPtr image_transform(double scale, const std::vector<double>& mean, const std::vector<double>& std,
                             int64_t crop_padding, double flip) {
  std::vector<TransformPtr> stages{to_float(scale)};
  if (!mean.empty()) stages.push_back(normalize(mean, std));
  if (crop_padding > 0) stages.push_back(random_crop(crop_padding));
  if (flip > 0) stages.push_back(random_horizontal_flip(flip));
  return compose(std::move(stages));
}

// The Python Loader's and ImageFolder's arguments, as the C++ loader takes them.
LoaderOptions loader_options(int64_t batch_size, bool shuffle, bool drop_last, int64_t workers, int64_t prefetch,
                             int64_t seed, bool channels_last) {
  return LoaderOptions()
      .batch_size(batch_size)
      .shuffle(shuffle)
      .drop_last(drop_last)
      .workers(int(workers))
      .prefetch(prefetch)
      .seed(uint64_t(seed))
      .channels_last(channels_last);
}

class ScriptLoader : public torch::CustomClassHolder {
 public:
  ScriptLoader(torch::Tensor inputs, torch::Tensor targets, int64_t batch_size, bool shuffle, bool drop_last,
               int64_t workers, int64_t prefetch, int64_t seed, bool channels_last, bool transform, double scale,
               std::vector<double> mean, std::vector<double> std, int64_t crop_padding, double flip)
      : loader_(std::make_shared<TensorDataset>(std::move(inputs), std::move(targets)),
                loader_options(batch_size, shuffle, drop_last, workers, prefetch, seed, channels_last), transform ? image_transform(scale, mean, std, crop_padding, flip) : nullptr) {}

  // Any dataset and transform (the image folder pipeline's, made by an op below).
  ScriptLoader(DatasetPtr dataset, const LoaderOptions& options, TransformPtr transform)
      : loader_(std::move(dataset), options, std::move(transform)) {}

  int64_t batches_per_epoch() const { return loader_.batches_per_epoch(); }

  // Starts `epoch` (its order a function of the seed and the epoch alone); ends any other.
  void start_epoch(int64_t epoch) {
    epoch_.reset();
    epoch_.emplace(loader_.epoch(epoch));
    next_.emplace(epoch_->begin());
    handed_out_ = false;
  }

  // The next batch of the epoch, or an empty list at its end. The wait for a batch happens
  // here, when it is asked for, not while the caller trains on the one before.
  std::vector<torch::Tensor> next() {
    if (!epoch_) throw UsageError("Loader", "call start_epoch before next");
    if (handed_out_) {
      ++*next_;
      handed_out_ = false;
    }
    if (*next_ == epoch_->end()) return {};
    handed_out_ = true;
    Batch& batch = **next_;
    return {std::move(batch.input), std::move(batch.target)};
  }

 private:
  Loader loader_;
  std::optional<EpochRange> epoch_;
  std::optional<EpochRange::Iterator> next_;
  bool handed_out_ = false;  // whether *next_ went to the caller already
};

Split split_named(const std::string& split) {
  if (split != "train" && split != "test") throw UsageError("split", "expected train or test, got " + split);
  return split == "train" ? Split::train : Split::test;
}

std::tuple<torch::Tensor, torch::Tensor> load_mnist_op(const std::string& dir, const std::string& split) {
  const auto dataset = std::static_pointer_cast<const TensorDataset>(load_mnist(dir, split_named(split)));
  return {dataset->inputs(), dataset->targets()};
}

// Image files or a pack's records decoded and augmented per epoch by the loader's workers
// (image_pipeline.h): `transforms` as image_transforms.h lists them, in training or (train false)
// their evaluation counterpart, at `size` (0: the list's, else 224).
c10::intrusive_ptr<ScriptLoader> image_loader(std::shared_ptr<const ImageRecords> records,
                                              const std::string& transforms, int64_t size, bool train,
                                              int64_t batch_size, bool shuffle, bool drop_last, int64_t workers,
                                              int64_t prefetch, int64_t seed, bool channels_last,
                                              std::vector<double> mean, std::vector<double> std, bool reduced_decode,
                                              c10::ScalarType dtype, bool block_local = false) {
  const ImageTransforms listed = parse_image_transforms(transforms);
  const int64_t side = listed.side(size) > 0 ? listed.side(size) : 224;
  TransformPtr transform = decode_images(records, listed.decode_options(train, side)
                                                      .mean(std::move(mean))
                                                      .std(std::move(std))
                                                      .reduced_decode(reduced_decode)
                                                      .dtype(dtype)
                                                      .channels_last(channels_last));
  return c10::make_intrusive<ScriptLoader>(
      records, loader_options(batch_size, shuffle, drop_last, workers, prefetch, seed, channels_last).block_local(block_local),
      std::move(transform));
}

c10::intrusive_ptr<ScriptLoader> image_folder_loader_op(std::vector<std::string> paths, std::vector<int64_t> labels,
                                                        std::vector<std::string> classes, const std::string& transforms,
                                                        int64_t size, bool train, int64_t batch_size, bool shuffle,
                                                        bool drop_last, int64_t workers, int64_t prefetch, int64_t seed,
                                                        bool channels_last, std::vector<double> mean,
                                                        std::vector<double> std, bool reduced_decode,
                                                        c10::ScalarType dtype) {
  auto files =
      std::make_shared<const ImageFiles>(ImageFileList{std::move(paths), std::move(labels), std::move(classes)});
  return image_loader(files, transforms, size, train, batch_size, shuffle, drop_last, workers, prefetch, seed,
                      channels_last, std::move(mean), std::move(std), reduced_decode, dtype);
}

// `block_local`: the pack's records in block_local_order (loader.h) instead of a full shuffle.
c10::intrusive_ptr<ScriptLoader> pack_loader_op(const std::string& path, const std::string& transforms, int64_t size,
                                                bool train, int64_t batch_size, bool shuffle, bool drop_last,
                                                int64_t workers, int64_t prefetch, int64_t seed, bool channels_last,
                                                std::vector<double> mean, std::vector<double> std,
                                                bool reduced_decode, c10::ScalarType dtype, bool block_local) {
  return image_loader(std::make_shared<const PackedImages>(path), transforms, size, train, batch_size, shuffle,
                      drop_last, workers, prefetch, seed, channels_last, std::move(mean), std::move(std),
                      reduced_decode, dtype, block_local);
}

std::tuple<int64_t, int64_t, int64_t, std::vector<std::string>> pack_image_folder_op(
    const std::string& source, const std::string& output, int64_t max_side, int64_t quality, bool raw,
    const c10::optional<std::vector<std::string>>& classes, bool skip_corrupt) {
  PackOptions options = PackOptions().max_side(max_side).quality(quality).raw(raw).classes(
      classes.value_or(std::vector<std::string>{}));
  if (skip_corrupt) options.skipped(std::make_shared<SkippedInputs>());
  const PackSummary summary = pack_image_folder(source, output, options);
  return {summary.records, summary.resumed, summary.bytes,
          options.skipped() ? options.skipped()->lines() : std::vector<std::string>{}};
}

std::tuple<std::vector<torch::Tensor>, torch::Tensor, std::vector<std::string>> read_pack_op(const std::string& path) {
  const PackedImages pack(path);
  std::vector<torch::Tensor> images;
  for (int64_t i = 0; i < pack.size(); ++i) images.push_back(decode_record(pack, i));
  return {images, torch::tensor(pack.labels(), torch::kLong), pack.classes()};
}

std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<std::string>> list_image_folder_op(
    const std::string& dir, const c10::optional<std::vector<std::string>>& classes) {
  ImageFileList list = list_image_folder(dir, classes.value_or(std::vector<std::string>{}));
  return {std::move(list.paths), std::move(list.labels), std::move(list.classes)};
}

torch::Tensor resample_box_op(const torch::Tensor& image, int64_t x, int64_t y, int64_t width, int64_t height,
                              int64_t size) {
  if (image.scalar_type() != torch::kByte || image.dim() != 3) {
    throw UsageError("image", "expected uint8 [C, H, W], got " + c10::str(image.scalar_type(), " ", image.sizes()));
  }
  Pixels pixels;
  pixels.channels = image.size(0);
  pixels.height = image.size(1);
  pixels.width = image.size(2);
  const torch::Tensor hwc = image.permute({1, 2, 0}).contiguous();
  pixels.hwc.assign(hwc.data_ptr<uint8_t>(), hwc.data_ptr<uint8_t>() + hwc.numel());
  return resample_box(pixels, Box{x, y, width, height}, size);
}

std::tuple<torch::Tensor, torch::Tensor, std::vector<std::string>> load_images_op(
    const std::string& path, const std::string& format, const std::string& split, int64_t image_size,
    const c10::optional<std::vector<std::string>>& classes, const std::string& label_column) {
  const DataFormat chosen = format == "auto" ? detect_data_format(path) : parse_data_format(format);
  const LabelledDataset loaded = load_images(path, chosen, split_named(split),
                                             SourceOptions()
                                                 .image_size(image_size)
                                                 .classes(classes.value_or(std::vector<std::string>{}))
                                                 .label_column(label_column));
  const auto& dataset = static_cast<const TensorDataset&>(*loaded.dataset);
  return {dataset.inputs(), dataset.targets(), loaded.classes};
}

std::tuple<torch::Tensor, torch::Tensor> read_csv_op(const std::string& path, int64_t label_column,
                                                     const std::string& label_name, bool header,
                                                     const std::string& delimiter, int64_t classes) {
  if (delimiter.size() != 1) throw UsageError("delimiter", "expected one character, got '" + delimiter + "'");
  const auto dataset = std::static_pointer_cast<const TensorDataset>(read_csv(
      path,
      CsvOptions().label_column(label_column).label_name(label_name).header(header).delimiter(delimiter[0]).classes(
          classes)));
  return {dataset->inputs(), dataset->targets()};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(afterburner, m) {
  m.class_<ScriptLoader>("Loader")
      .def(torch::init<torch::Tensor, torch::Tensor, int64_t, bool, bool, int64_t, int64_t, int64_t, bool, bool, double,
                       std::vector<double>, std::vector<double>, int64_t, double>())
      .def("batches_per_epoch", &ScriptLoader::batches_per_epoch)
      .def("start_epoch", &ScriptLoader::start_epoch)
      .def("next", &ScriptLoader::next);
  // An IDX file (raw or .gz) as a tensor of its element type and shape.
  m.def("read_idx(str path) -> Tensor", [](const std::string& path) { return read_idx(path); });
  // <dir>/{train,t10k}-*-ubyte[.gz] (the MNIST layout): images uint8 [N, 1, 28, 28], labels int64 [N].
  m.def("load_mnist(str dir, str split) -> (Tensor, Tensor)", load_mnist_op);
  // Any dataset `afterburner train --data` reads (data/sources.h): images uint8 [N, C, S, S] (or a
  // table's features float [N, F]), labels int64 [N] and the class names.
  m.def("load_images(str path, str format=\"auto\", str split=\"train\", int image_size=0, str[]? classes=None, "
        "str label_column=\"\") -> (Tensor, Tensor, str[])",
        load_images_op);
  // An image folder's listing, and a loader of its files decoding and augmenting each epoch
  // (data/image_pipeline.h).
  m.def("image_folder_loader(str[] paths, int[] labels, str[] classes, str transforms, int size, bool train, "
        "int batch_size, bool shuffle, bool drop_last, int workers, int prefetch, int seed, bool channels_last, "
        "float[] mean, float[] std, bool reduced_decode, ScalarType dtype) -> "
        "__torch__.torch.classes.afterburner.Loader",
        image_folder_loader_op);
  m.def("list_image_folder(str dir, str[]? classes=None) -> (str[], int[], str[])", list_image_folder_op);
  // A pack's loader, as image_folder_loader's; packing an image folder; a pack read whole (pack.h).
  m.def("pack_loader(str path, str transforms, int size, bool train, int batch_size, bool shuffle, bool drop_last, "
        "int workers, int prefetch, int seed, bool channels_last, float[] mean, float[] std, bool reduced_decode, "
        "ScalarType dtype, bool block_local) -> __torch__.torch.classes.afterburner.Loader",
        pack_loader_op);
  m.def("pack_image_folder(str source, str output, int max_side=0, int quality=90, bool raw=False, "
        "str[]? classes=None, bool skip_corrupt=False) -> (int, int, int, str[])",
        pack_image_folder_op);
  m.def("read_pack(str path) -> (Tensor[], Tensor, str[])", read_pack_op);
  // A pack's size, labels, classes and whether it exceeds half the available memory.
  m.def("read_pack_index(str path) -> (int, int[], str[], bool)", [](const std::string& path) {
    const PackedImages pack(path);
    return std::make_tuple(pack.size(), pack.labels(), pack.classes(), pack.larger_than_memory());
  });
  // The pipeline's resampling of one box of a uint8 [C, H, W] image to size x size (float, 0..255).
  m.def("resample_box(Tensor image, int x, int y, int width, int height, int size) -> Tensor", resample_box_op);
  // One JPEG or PNG file as uint8 [C, H, W] (data/image_file.h).
  m.def("decode_image_file(str path) -> Tensor", [](const std::string& path) { return decode_image_file(path); });
  // A .npy file as a tensor of its dtype and shape.
  m.def("read_npy(str path) -> Tensor", [](const std::string& path) { return read_npy(path); });
  // A numeric CSV file: features float32 [N, F] and labels int64 [N] (data::read_csv's rules).
  m.def("read_csv(str path, int label_column=-1, str label_name=\"\", bool header=True, str delimiter=\",\", "
        "int classes=0) -> (Tensor, Tensor)",
        read_csv_op);
}

}  // namespace afterburner::data
