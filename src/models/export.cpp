#include "afterburner/models/export.h"

#include <fmt/format.h>
#include <torch/nn/modules.h>
#include <torch/script.h>

#include <variant>

#include "afterburner/core/error.h"
#include "afterburner/core/file_writer.h"
#include "afterburner/models/performer.h"
#include "afterburner/models/residual.h"
#include "afterburner/sketch/script.h"
#include "afterburner/sketch/skconv2d.h"
#include "afterburner/sketch/sklinear.h"

namespace afterburner::models {
namespace nn = torch::nn;
using torch::jit::Module;

namespace {

using CompilationUnitPtr = std::shared_ptr<torch::jit::CompilationUnit>;

Module new_module(const std::string& kind, const CompilationUnitPtr& unit) {
  return Module(c10::QualifiedName("__torch__.afterburner." + kind), unit, /*shouldMangle=*/true);
}

// Copies the layer's parameters and buffers (detached, so the export owns no autograd graph). The
// parameters require grad as the layer's do, as torch.jit.save keeps them: the file fine-tunes in
// Python or with `train --model` like a scripted nn.Module.
void copy_state(const nn::Module& layer, Module& out) {
  for (const auto& p : layer.named_parameters(/*recurse=*/false)) {
    out.register_parameter(p.key(), p.value().detach().clone().requires_grad_(p.value().requires_grad()),
                           /*is_buffer=*/false);
  }
  for (const auto& b : layer.named_buffers(/*recurse=*/false)) {
    out.register_buffer(b.key(), b.value().detach().clone());
  }
}

std::string list2(const torch::ExpandingArray<2>& v) { return fmt::format("[{}, {}]", (*v)[0], (*v)[1]); }

std::string bias_or_none(const nn::Module& layer) {
  return layer.named_parameters(false).contains("bias") ? "self.bias" : "None";
}

Module export_sequential(const nn::Sequential& seq, const CompilationUnitPtr& unit);

// One layer as TorchScript: its state plus a forward written in TorchScript source.
Module export_layer(const std::shared_ptr<nn::Module>& layer, const CompilationUnitPtr& unit) {
  auto define = [&](const std::string& kind, const std::string& body) {
    Module out = new_module(kind, unit);
    copy_state(*layer, out);
    out.define("def forward(self, x):\n    return " + body + "\n");
    return out;
  };
  if (auto conv = std::dynamic_pointer_cast<nn::Conv2dImpl>(layer)) {
    const auto& o = conv->options;
    // padding_t is c10::variant in older LibTorch, std::variant in newer: let ADL pick.
    using std::get;
    using std::holds_alternative;
    if (!holds_alternative<torch::ExpandingArray<2>>(o.padding())) {
      throw Error("export: Conv2d with string padding is not supported");
    }
    return define("Conv2d", fmt::format("torch.conv2d(x, self.weight, {}, {}, {}, {}, {})",
                                        bias_or_none(*conv), list2(o.stride()),
                                        list2(get<torch::ExpandingArray<2>>(o.padding())),
                                        list2(o.dilation()), o.groups()));
  }
  if (auto linear = std::dynamic_pointer_cast<nn::LinearImpl>(layer)) {
    return define("Linear", fmt::format("torch.linear(x, self.weight, {})", bias_or_none(*linear)));
  }
  if (auto bn = std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(layer)) {
    return define("BatchNorm2d", batch_norm_torchscript(bn->options.eps()));
  }
  if (auto norm = std::dynamic_pointer_cast<nn::LayerNormImpl>(layer)) {
    const auto& o = norm->options;
    if (!o.elementwise_affine()) throw Error("export: LayerNorm without elementwise_affine is not supported");
    return define("LayerNorm", fmt::format("torch.layer_norm(x, [{}], self.weight, self.bias, {})",
                                           fmt::join(o.normalized_shape(), ", "), o.eps()));
  }
  if (auto own = std::dynamic_pointer_cast<SelfExportingLayer>(layer)) {
    return define(own->torchscript_kind(), own->torchscript_forward());
  }
  if (auto sketched = std::dynamic_pointer_cast<sketch::SKLinearImpl>(layer)) return sketch::script_layer(*sketched, unit);
  if (auto sketched = std::dynamic_pointer_cast<sketch::SKConv2dImpl>(layer)) return sketch::script_layer(*sketched, unit);
  if (std::dynamic_pointer_cast<nn::ReLUImpl>(layer)) return define("ReLU", "torch.relu(x)");
  if (std::dynamic_pointer_cast<nn::DropoutImpl>(layer)) return define("Identity", "x");
  if (std::dynamic_pointer_cast<nn::FlattenImpl>(layer)) {
    auto& o = std::dynamic_pointer_cast<nn::FlattenImpl>(layer)->options;
    return define("Flatten", fmt::format("torch.flatten(x, {}, {})", o.start_dim(), o.end_dim()));
  }
  if (auto pool = std::dynamic_pointer_cast<nn::MaxPool2dImpl>(layer)) {
    const auto& o = pool->options;
    return define("MaxPool2d", fmt::format("torch.max_pool2d(x, {}, {}, {}, {}, {})",
                                           list2(o.kernel_size()), list2(o.stride()),
                                           list2(o.padding()), list2(o.dilation()),
                                           o.ceil_mode() ? "True" : "False"));
  }
  if (auto pool = std::dynamic_pointer_cast<nn::AdaptiveAvgPool2dImpl>(layer)) {
    auto size = pool->options.output_size();
    if (!size->at(0) || !size->at(1)) throw Error("export: AdaptiveAvgPool2d with None sizes is not supported");
    return define("AdaptiveAvgPool2d",
                  fmt::format("torch.adaptive_avg_pool2d(x, [{}, {}])", *size->at(0), *size->at(1)));
  }
  if (auto block = std::dynamic_pointer_cast<BasicBlockImpl>(layer)) {
    Module out = new_module("BasicBlock", unit);
    for (const char* name : {"conv1", "bn1", "conv2", "bn2"}) {
      out.register_module(name, export_layer(block->named_children()[name], unit));
    }
    out.register_module("shortcut", export_sequential(block->shortcut, unit));
    out.define(
        "def forward(self, x):\n"
        "    y = torch.relu(self.bn1.forward(self.conv1.forward(x)))\n"
        "    y = self.bn2.forward(self.conv2.forward(y))\n"
        "    return torch.relu(y + self.shortcut.forward(x))\n");
    return out;
  }
  if (auto block = std::dynamic_pointer_cast<PerformerBlockImpl>(layer)) {
    Module out = new_module("PerformerBlock", unit);
    for (const char* name : {"ln1", "ln2", "fc1", "fc2"}) {
      out.register_module(name, export_layer(block->named_children()[name], unit));
    }
    out.register_module("attention", sketch::script_layer(*block->attention, unit));
    out.define(
        "def forward(self, x):\n"
        "    normed = self.ln1.forward(x)\n"
        "    h = x + self.attention.forward(normed, normed, normed)\n"
        "    return h + self.fc2.forward(torch.gelu(self.fc1.forward(self.ln2.forward(h))))\n");
    return out;
  }
  if (auto seq = std::dynamic_pointer_cast<nn::SequentialImpl>(layer)) {
    return export_sequential(nn::Sequential(seq), unit);
  }
  throw Error("export: layer type '" + layer->name() + "' has no TorchScript export");
}

}  // namespace

std::string batch_norm_torchscript(double eps) {
  return fmt::format("torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, False, 0.0, "
                     "{}, False)",
                     eps);
}

namespace {

Module export_sequential(const nn::Sequential& seq, const CompilationUnitPtr& unit) {
  Module out = new_module("Sequential", unit);
  std::string body = "def forward(self, x):\n";
  for (size_t i = 0; i < seq->size(); ++i) {
    std::string name = fmt::format("layer{}", i);
    out.register_module(name, export_layer(seq->ptr(i), unit));
    body += fmt::format("    x = self.{}.forward(x)\n", name);
  }
  out.define(body + "    return x\n");
  return out;
}

}  // namespace

void export_torchscript(const torch::nn::Sequential& model, const std::string& path,
                        const std::unordered_map<std::string, std::string>& extra_files) {
  auto unit = std::make_shared<torch::jit::CompilationUnit>();
  Module module = export_sequential(model, unit);
  module.eval();
  try {
    write_file_atomically(path, module, extra_files);
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    throw Error(path + ": cannot write the TorchScript file (" + message.substr(0, message.find('\n')) + ")");
  }
}

}  // namespace afterburner::models
