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

class ScriptLoader : public torch::CustomClassHolder {
 public:
  ScriptLoader(torch::Tensor inputs, torch::Tensor targets, int64_t batch_size, bool shuffle, bool drop_last,
               int64_t workers, int64_t prefetch, int64_t seed, bool channels_last, bool transform, double scale,
               std::vector<double> mean, std::vector<double> std, int64_t crop_padding, double flip)
      : loader_(std::make_shared<TensorDataset>(std::move(inputs), std::move(targets)),
                LoaderOptions()
                    .batch_size(batch_size)
                    .shuffle(shuffle)
                    .drop_last(drop_last)
                    .workers(int(workers))
                    .prefetch(prefetch)
                    .seed(uint64_t(seed))
                    .channels_last(channels_last),
                transform ? image_transform(scale, mean, std, crop_padding, flip) : nullptr) {}

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

std::tuple<torch::Tensor, torch::Tensor> load_mnist_op(const std::string& dir, const std::string& split) {
  if (split != "train" && split != "test") throw UsageError("split", "expected train or test, got " + split);
  const auto dataset = std::static_pointer_cast<const TensorDataset>(
      load_mnist(dir, split == "train" ? Split::train : Split::test));
  return {dataset->inputs(), dataset->targets()};
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
  // A numeric CSV file: features float32 [N, F] and labels int64 [N] (data::read_csv's rules).
  m.def("read_csv(str path, int label_column=-1, str label_name=\"\", bool header=True, str delimiter=\",\", "
        "int classes=0) -> (Tensor, Tensor)",
        read_csv_op);
}

}  // namespace afterburner::data
