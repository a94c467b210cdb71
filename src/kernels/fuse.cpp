#include "afterburner/kernels/fuse.h"

#include <fmt/format.h>
#include <torch/nn/modules.h>

#include "afterburner/kernels/conv_relu.h"
#include "afterburner/kernels/linear_relu.h"
#include "afterburner/kernels/relu_maxpool.h"

namespace afterburner::kernels {
namespace nn = torch::nn;
namespace {

// Why a MaxPool2d cannot become a ReluMaxPool2d, or "" when it can (which then runs its fast
// path or, outside it, torch's relu + max_pool2d with the same options).
std::string pool_unsupported(const nn::MaxPool2dOptions& o) {
  auto k = *o.kernel_size(), s = *o.stride(), p = *o.padding(), d = *o.dilation();
  if (k[0] != k[1] || s[0] != s[1] || p[0] != p[1] || d[0] != d[1]) {
    return "windows must be square (kernel, stride, padding and dilation alike in both dimensions)";
  }
  return "";
}

ReluMaxPool2dOptions relu_pool_options(const nn::MaxPool2dOptions& o) {
  return ReluMaxPool2dOptions((*o.kernel_size())[0])
      .stride((*o.stride())[0])
      .padding((*o.padding())[0])
      .dilation((*o.dilation())[0])
      .ceil_mode(o.ceil_mode());
}

bool fusable_pool(const std::shared_ptr<nn::Module>& module) {
  auto pool = std::dynamic_pointer_cast<nn::MaxPool2dImpl>(module);
  return pool && pool_unsupported(pool->options).empty();
}

class Rewriter {
 public:
  Rewriter(const FuseOptions& options, FuseResult& result) : options_(options), result_(result) {}

  nn::Sequential rewrite(const nn::Sequential& model) {
    std::vector<nn::AnyModule> modules(model->begin(), model->end());
    auto at = [&](size_t i) { return i < modules.size() ? modules[i].ptr() : nullptr; };
    nn::Sequential out;
    for (size_t i = 0; i < modules.size(); ++i) {
      auto layer = modules[i].ptr();
      auto next = at(i + 1);
      std::string where = fmt::format("{}-{}", i, i + 1);
      if (options_.relu_max_pool() && is<nn::ReLUImpl>(layer) && is<nn::MaxPool2dImpl>(next)) {
        auto pool = std::dynamic_pointer_cast<nn::MaxPool2dImpl>(next);
        std::string reason = pool_unsupported(pool->options);
        if (reason.empty()) {
          out->push_back(nn::Identity());
          out->push_back(ReluMaxPool2d(relu_pool_options(pool->options)));
          result_.fused.push_back("layers " + where + ": ReLU + MaxPool2d -> ReluMaxPool2d");
          ++i;
          continue;
        }
        result_.notices.push_back("fuse: layers " + where + " (ReLU + MaxPool2d) left unfused: " + reason);
      }
      if (options_.conv_relu() && is<nn::Conv2dImpl>(layer) && is<nn::ReLUImpl>(next) &&
          !(options_.relu_max_pool() && fusable_pool(at(i + 2)))) {
        auto conv = nn::Conv2d(std::dynamic_pointer_cast<nn::Conv2dImpl>(layer));
        std::string reason = conv_relu_unsupported(conv);
        if (reason.empty()) {
          out->push_back(Conv2dReLUImpl::from_conv(conv));
          out->push_back(nn::Identity());
          result_.fused.push_back("layers " + where + ": Conv2d + ReLU -> Conv2dReLU");
          ++i;
          continue;
        }
        result_.notices.push_back("fuse: layers " + where + " (Conv2d + ReLU) left unfused: " + reason);
      }
      if (options_.linear_relu() && is<nn::LinearImpl>(layer) && is<nn::ReLUImpl>(next)) {
        out->push_back(LinearReLUImpl::from_linear(nn::Linear(std::dynamic_pointer_cast<nn::LinearImpl>(layer))));
        out->push_back(nn::Identity());
        result_.fused.push_back("layers " + where + ": Linear + ReLU -> LinearReLU");
        ++i;
        continue;
      }
      out->push_back(modules[i]);
    }
    return out;
  }

 private:
  template <typename Impl>
  static bool is(const std::shared_ptr<nn::Module>& module) {
    return module && std::dynamic_pointer_cast<Impl>(module) != nullptr;
  }

  const FuseOptions& options_;
  FuseResult& result_;
};

}  // namespace

FuseResult fuse(const torch::nn::Sequential& model, const FuseOptions& options) {
  FuseResult result;
  result.model = Rewriter(options, result).rewrite(model);
  return result;
}

}  // namespace afterburner::kernels
