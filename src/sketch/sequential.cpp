#include "afterburner/sketch/sequential.h"

#include <fmt/format.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <variant>

#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::sketch {
namespace nn = torch::nn;
namespace {

int64_t trainable_parameters(const nn::Module& model) {
  int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

// Why a Conv2d has no sketched form, or "" when it has.
std::string conv_unsupported(const nn::detail::ConvNdOptions<2>& o) {
  // The variants are c10::variant in older LibTorch, std::variant in newer: let ADL pick.
  using std::holds_alternative;
  if (o.groups() != 1) return "grouped convolutions are not sketched";
  if ((*o.dilation())[0] != 1 || (*o.dilation())[1] != 1) return "dilated convolutions are not sketched";
  if (!holds_alternative<torch::ExpandingArray<2>>(o.padding())) return "its padding is not a pair of integers";
  if (!holds_alternative<torch::enumtype::kZeros>(o.padding_mode())) return "only zero padding is sketched";
  return "";
}

class Sketcher {
 public:
  Sketcher(const SketchConfig& config, SketchReport& report) : config_(config), report_(report) {}

  nn::Sequential rewrite(const nn::Sequential& model) {
    nn::Sequential out;
    const auto names = model->named_children().keys();
    size_t index = 0;
    for (const nn::AnyModule& layer : *model) {
      const std::string& name = names[index++];
      out->push_back(name, replacement(layer, name));
    }
    return out;
  }

 private:
  nn::AnyModule replacement(const nn::AnyModule& layer, const std::string& path) {
    const std::shared_ptr<nn::Module> module = layer.ptr();
    if (auto linear = std::dynamic_pointer_cast<nn::LinearImpl>(module)) {
      LayerPlan plan = plan_layer(config_, path, LayerKind::linear, linear->weight.sizes().vec(), linear->bias.defined());
      if (!plan.replaced()) return keep(layer, std::move(plan));
      SKLinear sketched(SKLinearOptions(linear->options.in_features(), linear->options.out_features())
                            .terms(plan.terms).rank(plan.rank).bias(linear->bias.defined()),
                        linear->weight);
      copy_bias(linear->bias, sketched->bias);
      report_.layers.push_back(std::move(plan));
      return nn::AnyModule(sketched);
    }
    if (auto conv = std::dynamic_pointer_cast<nn::Conv2dImpl>(module)) {
      const auto& o = conv->options;
      const std::string unsupported = conv_unsupported(o);
      LayerPlan plan = unsupported.empty()
                           ? plan_layer(config_, path, LayerKind::conv2d, conv->weight.sizes().vec(), conv->bias.defined())
                           : keep_layer(path, LayerKind::conv2d, conv->weight.sizes().vec(), conv->bias.defined(), unsupported);
      if (!plan.replaced()) return keep(layer, std::move(plan));
      using std::get;
      SKConv2d sketched(SKConv2dOptions(o.in_channels(), o.out_channels(), o.kernel_size())
                            .stride(o.stride())
                            .padding(get<torch::ExpandingArray<2>>(o.padding()))
                            .terms(plan.terms).rank(plan.rank).bias(conv->bias.defined()),
                        conv->weight);
      copy_bias(conv->bias, sketched->bias);
      report_.layers.push_back(std::move(plan));
      return nn::AnyModule(sketched);
    }
    return layer;
  }

  nn::AnyModule keep(const nn::AnyModule& layer, LayerPlan plan) {
    report_.layers.push_back(std::move(plan));
    return layer;
  }

  static void copy_bias(const torch::Tensor& dense, torch::Tensor& sketched) {
    if (!dense.defined()) return;
    torch::NoGradGuard no_grad;
    sketched.copy_(dense);
  }

  const SketchConfig& config_;
  SketchReport& report_;
};

template <typename Impl>
bool is(const nn::AnyModule& layer) {
  return std::dynamic_pointer_cast<Impl>(layer.ptr()) != nullptr;
}

}  // namespace

FusedEpilogues fuse_epilogues(const nn::Sequential& model) {
  FusedEpilogues out;
  const std::vector<nn::AnyModule> layers(model->begin(), model->end());
  const auto names = model->named_children().keys();
  for (size_t i = 0; i < layers.size();) {
    const auto sketched = std::dynamic_pointer_cast<SKLinearImpl>(layers[i].ptr());
    if (!sketched || sketched->options.relu() || sketched->options.dropout() > 0) {
      out.model->push_back(names[i], layers[i]);
      ++i;
      continue;
    }
    // A copy sharing every tensor (the Module's copy keeps the same parameters and buffers).
    auto fused = std::make_shared<SKLinearImpl>(*sketched);
    std::string what = "SKLinear";
    size_t next = i + 1;
    if (next < layers.size() && is<nn::ReLUImpl>(layers[next])) {
      fused->options.relu(true);
      what += " + ReLU";
      ++next;
    }
    if (next < layers.size() && is<nn::DropoutImpl>(layers[next])) {
      fused->options.dropout(std::dynamic_pointer_cast<nn::DropoutImpl>(layers[next].ptr())->options.p());
      what += " + Dropout";
      ++next;
    }
    if (next == i + 1) {
      out.model->push_back(names[i], layers[i]);
      ++i;
      continue;
    }
    out.model->push_back(names[i], nn::AnyModule(SKLinear(fused)));
    for (size_t j = i + 1; j < next; ++j) out.model->push_back(names[j], nn::AnyModule(nn::Identity()));
    out.fused.push_back(fmt::format("layers {}-{}: {}", names[i], names[next - 1], what));
    i = next;
  }
  return out;
}

SketchedSequential sketch_sequential(const nn::Sequential& model, const SketchConfig& config) {
  check_config(config);
  SketchedSequential out;
  out.model = Sketcher(config, out.report).rewrite(model);
  out.report.params_before = trainable_parameters(*model);
  out.report.params_after = trainable_parameters(*out.model);
  return out;
}

}  // namespace afterburner::sketch
