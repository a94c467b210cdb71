#include "afterburner/data/image_transforms.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <set>
#include <sstream>

#include "afterburner/core/error.h"

namespace afterburner::data {
namespace {

// One item of the list: its name, the number glued to it ("224" of "crop224") and the one after a
// colon ("0.3" of "flip:0.3"), each empty when absent.
struct Item {
  std::string text, name, number, parameter;
};

Item split_item(const std::string& text) {
  Item item{text, {}, {}, {}};
  const size_t colon = text.find(':');
  const std::string head = text.substr(0, colon);
  if (colon != std::string::npos) item.parameter = text.substr(colon + 1);
  const size_t digits = head.find_first_of("0123456789");
  item.name = head.substr(0, digits);
  if (digits != std::string::npos) item.number = head.substr(digits);
  return item;
}

class ListParser {
 public:
  ListParser(std::string what, std::string list) : what_(std::move(what)), list_(std::move(list)) {}

  ImageTransforms parse() {
    std::stringstream items(list_);
    std::string text;
    while (std::getline(items, text, ',')) {
      if (text.empty()) fail(text, "an empty item");
      take(split_item(text));
    }
    if (transforms_.resize > 0 && !transforms_.crop) fail("resize", "a resize needs a crop after it (crop or centre)");
    if (transforms_.padding > 0 && transforms_.crop != Crop::random) fail("pad", "padding needs a crop after it (crop)");
    if (transforms_.resize > 0 && transforms_.size > transforms_.resize) {
      fail("resize", fmt::format("the {}-pixel crop is larger than the shorter side resized to {}", transforms_.size,
                                 transforms_.resize));
    }
    return transforms_;
  }

 private:
  void take(const Item& item) {
    const std::string name = item.name == "center" ? "centre" : item.name;
    if (!seen_.insert(name).second) fail(item.text, "given twice");
    if (name == "rrc" || name == "crop" || name == "centre") {
      if (transforms_.crop) fail(item.text, "a second crop");
      transforms_.crop = name == "rrc" ? Crop::random_resized : name == "crop" ? Crop::random : Crop::centre;
      transforms_.size = item.number.empty() ? 0 : whole(item, item.number, 1);
      if (name == "rrc" && !item.parameter.empty()) {
        transforms_.min_area = fraction(item, false);
      } else {
        no_parameter(item);
      }
      if (name == "rrc" && (transforms_.resize > 0 || transforms_.padding > 0)) {
        fail(item.text, "RandomResizedCrop takes no resize or pad before it");
      }
    } else if (name == "resize" || name == "pad") {
      if (transforms_.crop) fail(item.text, "comes after the crop; write it before");
      if (item.number.empty()) fail(item.text, "needs its pixels, e.g. " + name + (name == "pad" ? "4" : "256"));
      no_parameter(item);
      (name == "resize" ? transforms_.resize : transforms_.padding) = whole(item, item.number, 1);
    } else if (name == "flip") {
      if (!item.number.empty()) fail(item.text, "write its probability after a colon, e.g. flip:0.3");
      transforms_.flip = item.parameter.empty() ? 0.5 : fraction(item, true);
    } else {
      fail(item.text, "unknown: the items are rrcS[:MIN], resizeR, cropS, centreS, padP and flip[:P]");
    }
  }

  int64_t whole(const Item& item, const std::string& digits, int64_t minimum) const {
    int64_t value = 0;
    for (char c : digits) {
      if (c < '0' || c > '9' || value > 1'000'000) fail(item.text, "'" + digits + "' is not a pixel count");
      value = value * 10 + (c - '0');
    }
    if (value < minimum) fail(item.text, fmt::format("must be at least {}", minimum));
    return value;
  }

  // The item's parameter, a number in [0, 1] (or (0, 1]).
  double fraction(const Item& item, bool zero_allowed) const {
    size_t used = 0;
    double value = std::nan("");
    try {
      value = std::stod(item.parameter, &used);
    } catch (const std::exception&) {
    }
    if (used != item.parameter.size() || !((zero_allowed ? value >= 0 : value > 0) && value <= 1)) {
      fail(item.text, fmt::format("'{}' is not a number in {}0, 1]", item.parameter, zero_allowed ? "[" : "("));
    }
    return value;
  }

  void no_parameter(const Item& item) const {
    if (!item.parameter.empty()) fail(item.text, "takes no ':' parameter");
  }

  [[noreturn]] void fail(const std::string& item, const std::string& problem) const {
    throw UsageError(what_, fmt::format("'{}' in '{}': {}", item, list_, problem));
  }

  std::string what_, list_;
  ImageTransforms transforms_;
  std::set<std::string> seen_;
};

}  // namespace

bool ImageTransforms::decodes() const { return crop && padding == 0; }

int64_t ImageTransforms::side(int64_t image_size) const {
  if (size > 0 && image_size > 0 && size != image_size) {
    throw UsageError(source, fmt::format("the {}-pixel crop differs from the image size, {}", size, image_size));
  }
  return size > 0 ? size : image_size;
}

DecodeOptions ImageTransforms::decode_options(bool training, int64_t image_size) const {
  if (padding > 0) throw UsageError(source, "pad applies to images held in memory, not to decoded ones");
  const int64_t out = side(image_size);
  if (out < 1) throw UsageError(source, "give the crop's size (e.g. rrc224) or an image size");
  if (!training) return DecodeOptions().size(out).crop(Crop::centre).resize(resize > 0 ? resize : out * 256 / 224).flip(0);
  if (!crop) throw UsageError(source, "images decoded each epoch need a crop to one size: rrc, crop or centre");
  return DecodeOptions().size(out).crop(*crop).min_area(min_area).resize(resize).flip(flip);
}

std::vector<TransformPtr> ImageTransforms::stored_transforms(int64_t image_size) const {
  if (resize > 0 || (crop && crop != Crop::random) || (crop == Crop::random && padding == 0)) {
    throw UsageError(source, "rrc, resize, crop without pad, and centre crop images as they are decoded: "
                                   "image folders and packs read each epoch");
  }
  side(image_size);
  std::vector<TransformPtr> chain;
  if (padding > 0) chain.push_back(random_crop(padding));
  if (flip > 0) chain.push_back(random_horizontal_flip(flip));
  return chain;
}

std::string ImageTransforms::describe(int64_t image_size) const {
  const int64_t out = side(image_size);
  std::vector<std::string> items;
  if (resize > 0) items.push_back(fmt::format("resize{}", resize));
  if (padding > 0) items.push_back(fmt::format("pad{}", padding));
  if (crop == Crop::random_resized) items.push_back(fmt::format("rrc{}:{}", out, min_area));
  if (crop == Crop::random) items.push_back(fmt::format("crop{}", out));
  if (crop == Crop::centre) items.push_back(fmt::format("centre{}", out));
  if (flip > 0) items.push_back(fmt::format("flip:{}", flip));
  return fmt::format("{}", fmt::join(items, ","));
}

std::string ImageTransforms::describe_evaluation(int64_t image_size) const {
  const DecodeOptions options = decode_options(false, image_size);
  return fmt::format("resize{},centre{}", options.resize(), options.size());
}

ImageTransforms parse_image_transforms(const std::string& list, const std::string& what) {
  if (list.empty()) return ImageTransforms{}.named(what);
  return ListParser(what, list).parse().named(what);
}

}  // namespace afterburner::data
