// TorchScript models a user could hand to afterburner, mutated at the graph level, then put
// through everything afterburner does with a user's file: copy_model (the copy must compute
// what the model does, bit for bit), optimize at fp32, bf16 and int8 (each result prepared for
// inference, run at batch 1 and 3 and verified against the model), what serve does when it
// loads a model (load, eval, prepare, warm-up at batch 1 to 3), and sketch then a forward.
//
// The input is a program, not a file: byte 0 picks the base model, byte 1 the sketch's rank and
// terms, then each mutation is an opcode byte followed by its operands (bytes past the end read
// as 0; an index reads two bytes, modulo the number of choices):
//   0 one storage      every float32 parameter and buffer a view of one storage (as a flat
//                      optimizer's buffer holds them): order, then packed, gapped or overlapping
//   1 tie              a parameter or buffer becomes another one of the same shape
//   2 replace tensor   a parameter or buffer replaced by one of another shape, dtype (double,
//                      half, bfloat16, int64), strides (transposed, strided, expanded), with no
//                      elements, or with NaN and inf values
//   3 swap inputs      two Tensor inputs of a node swapped
//   4 reroute input    a node's Tensor input replaced by another Tensor value dominating it
//   5 int constant     an int input of a node (stride, padding, dilation, groups, dims, a list's
//                      element), or a whole int[] with a length of its own, set to 0, negative
//                      or large values
//   6 delete node      a node's one Tensor output replaced by one of its Tensor inputs
//   7 duplicate node   a node cloned right after itself, later uses reading the clone, which
//                      reads the original's output (a chain) or the original's inputs
// Graph mutations apply to any method of any module of the model. The result must pass the
// graph's lint, save, and load back through infer::load_model: only files LibTorch loads are
// tested, others are skipped. Any exception is a clean refusal; a crash, a hang (-timeout) or a
// sanitizer report is a finding.
//
// The seeds in corpus/model_graph/ select each base model and each mutation:
//   build-asan/tests/fuzz/fuzz_model_graph --write-seeds=tests/fuzz/corpus/model_graph
// (libFuzzer ignores flags that start with "--").
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "afterburner/infer/model_file.h"
#include "afterburner/infer/optimize.h"
#include "afterburner/infer/verify.h"
#include "afterburner/models/export.h"
#include "afterburner/models/zoo.h"
#include "afterburner/serve/model_service.h"
#include "afterburner/sketch/script.h"
#include "fuzz.h"

// A constant mutated to 2^20 asks for tensors of terabytes. Production's malloc refuses those
// and LibTorch throws "not enough memory"; under ASan that takes allocator_may_return_null. The
// base models' tensors are kilobytes: max_allocation_size_mb also refuses the mutations that
// ask for hundreds of megabytes (a padding of 2^20 on one side of a sketched convolution),
// which would only spend the input's time computing them (half a minute under ASan).
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1:max_allocation_size_mb=32"; }

namespace {
namespace jit = torch::jit;
namespace fs = std::filesystem;
using namespace afterburner;
namespace testing = afterburner::testing;

constexpr int kMaxMutations = 8;

// ----------------------------------------------------------------------- the input's program

class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool done() const { return position_ >= size_; }
  uint8_t byte() { return done() ? 0 : data_[position_++]; }

  // An index below `count` (> 0).
  size_t pick(size_t count) {
    const size_t high = byte();
    return (high << 8 | byte()) % count;
  }

  // Values a constant could hold: small ones, 0, negative, and the edges of int32 and int64.
  int64_t integer() {
    static constexpr int64_t kEdges[] = {0, 1, -1, 2, -2, 3, 4, 7, 8, 64, 1 << 20, -(1 << 20),
                                         std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(),
                                         int64_t{1} << 32, std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()};
    const uint8_t b = byte();
    if (b < 0x80) return kEdges[b % std::size(kEdges)];
    return static_cast<int64_t>(b) - 0xc0;  // -64 .. 63
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
};

// ------------------------------------------------------------------------------ base models
// The zoo's exports and modules defined from TorchScript source with a training attribute, as
// Python saves them. models::export_torchscript registers none, and optimize_for_inference takes
// a module without one as frozen already, so serve prepares the zoo's files unfrozen while it
// freezes the defined ones and lays them out for oneDNN: both paths are fuzzed.

using Unit = std::shared_ptr<jit::CompilationUnit>;

// In evaluation mode; its `training` attribute exists before any forward reads it, as in Python.
jit::Module new_module(const std::string& kind, const Unit& unit) {
  jit::Module m(c10::QualifiedName("__torch__.fuzz." + kind), unit, /*shouldMangle=*/true);
  m.register_attribute("training", c10::BoolType::get(), false);
  return m;
}

// As Python saves an nn.Parameter: requiring grad.
torch::Tensor parameter(const torch::Tensor& values) { return values.detach().requires_grad_(); }

jit::Module linear(const Unit& unit, int64_t in, int64_t out) {
  jit::Module m = new_module("Linear", unit);
  m.register_parameter("weight", parameter(torch::randn({out, in}) / std::sqrt(static_cast<double>(in))), false);
  m.register_parameter("bias", parameter(torch::randn({out}) * 0.1), false);
  m.define("def forward(self, x):\n    return torch.linear(x, self.weight, self.bias)\n");
  return m;
}

// torch.nn.Conv2d as Python scripts it (aten::conv2d), or as tracing records it (aten::_convolution).
jit::Module conv2d(const Unit& unit, int64_t in, int64_t out, int64_t padding, bool traced) {
  jit::Module m = new_module("Conv2d", unit);
  m.register_parameter("weight", parameter(torch::randn({out, in, 3, 3}) / std::sqrt(9.0 * in)), false);
  m.register_parameter("bias", parameter(torch::randn({out}) * 0.1), false);
  m.define(traced ? fmt::format("def forward(self, x):\n    return torch._convolution(x, self.weight, self.bias, "
                                "[1, 1], [{0}, {0}], [1, 1], False, [0, 0], 1, False, False, True, True)\n",
                                padding)
                  : fmt::format("def forward(self, x):\n    return torch.conv2d(x, self.weight, self.bias, [1, 1], "
                                "[{0}, {0}], [1, 1], 1)\n",
                                padding));
  return m;
}

// With statistics away from their 0/1 defaults, as after training.
jit::Module batch_norm(const Unit& unit, int64_t channels) {
  jit::Module m = new_module("BatchNorm2d", unit);
  m.register_parameter("weight", parameter(torch::rand({channels}) + 0.5), false);
  m.register_parameter("bias", parameter(torch::rand({channels}) * 0.4 - 0.2), false);
  m.register_buffer("running_mean", torch::rand({channels}) - 0.5);
  m.register_buffer("running_var", torch::rand({channels}) * 1.5 + 0.5);
  m.register_buffer("num_batches_tracked", torch::tensor(100, torch::kLong));
  m.define(
      "def forward(self, x):\n"
      "    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, self.training,\n"
      "                            0.1, 1e-05, False)\n");
  return m;
}

jit::Module root(const std::string& kind, const Unit& unit,
                 const std::vector<std::pair<std::string, jit::Module>>& children, const std::string& forward) {
  jit::Module m = new_module(kind, unit);
  for (const auto& [name, child] : children) m.register_module(name, child);
  m.define(forward);
  m.eval();
  return m;
}

// conv - BatchNorm - ReLU - Dropout, plus the input, into a linear layer; takes [N, 3, 8, 8].
jit::Module bn_dropout_residual() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  return root("BnDropoutResidual", unit,
              {{"conv", conv2d(unit, 3, 3, 1, false)}, {"bn", batch_norm(unit, 3)}, {"fc", linear(unit, 192, 10)}},
              "def forward(self, x):\n"
              "    y = torch.relu(self.bn.forward(self.conv.forward(x)))\n"
              "    y = torch.dropout(y, 0.5, self.training)\n"
              "    return self.fc.forward(torch.flatten(y + x, 1))\n");
}

// Logits and the embedding they come from, as a tuple; takes [N, 20].
jit::Module tuple_output() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  return root("TupleOutput", unit, {{"body", linear(unit, 20, 32)}, {"classifier", linear(unit, 32, 7)}},
              "def forward(self, x):\n"
              "    embedding = torch.relu(self.body.forward(x))\n"
              "    return self.classifier.forward(embedding), embedding\n");
}

// Two linear layers holding one weight tensor (their biases differ); takes [N, 16].
jit::Module tied_weights() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  jit::Module first = linear(unit, 16, 16), second = linear(unit, 16, 16);
  second._ivalue()->setAttr("weight", first.attr("weight"));
  return root("TiedWeights", unit, {{"first", first}, {"second", second}, {"head", linear(unit, 16, 10)}},
              "def forward(self, x):\n"
              "    return self.head.forward(torch.relu(self.second.forward(torch.relu(self.first.forward(x)))))\n");
}

// A convolution as tracing records it, BatchNorm, max pooling; takes [N, 2, 8, 8].
jit::Module traced_conv() {
  auto unit = std::make_shared<jit::CompilationUnit>();
  return root("TracedConv", unit,
              {{"conv", conv2d(unit, 2, 6, 0, true)}, {"bn", batch_norm(unit, 6)}, {"fc", linear(unit, 54, 10)}},
              "def forward(self, x):\n"
              "    y = torch.relu(self.bn.forward(self.conv.forward(x)))\n"
              "    y = torch.max_pool2d(y, [2, 2], [2, 2], [0, 0], [1, 1], False)\n"
              "    return self.fc.forward(torch.flatten(y, 1))\n");
}

std::string saved(const jit::Module& module) {
  std::ostringstream out;
  module.save(out);
  return out.str();
}

// The zoo's export, small images so that each input runs in well under a second.
std::string zoo_file(const std::string& name) {
  const testing::TempDir dir;
  const fs::path path = dir / "model.pt";
  models::export_torchscript(models::make_model(name, models::ModelOptions().image_size(8)), path.string());
  return testing::read_file(path);
}

std::vector<torch::Tensor> forward(jit::Module& model, const torch::Tensor& x) {
  c10::InferenceMode inference;
  return infer::output_tensors(model.forward({x}));
}

struct BaseModel {
  std::string name;
  std::string file;                   // as torch::jit::Module::save writes it
  std::vector<int64_t> sample_shape;  // forward's one input, without the batch dimension
  std::vector<torch::Tensor> inputs;  // at batch 1 and 3
  std::vector<int64_t> output_ranks;  // of each output tensor, the batch dimension included
};

BaseModel base_model(std::string name, std::string file, std::vector<int64_t> sample_shape) {
  BaseModel base{std::move(name), std::move(file), std::move(sample_shape), {}, {}};
  for (int64_t batch : {1, 3}) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), base.sample_shape.begin(), base.sample_shape.end());
    base.inputs.push_back(torch::randn(shape));
  }
  std::istringstream in(base.file);
  jit::Module loaded = jit::load(in);
  for (const torch::Tensor& output : forward(loaded, base.inputs[0])) base.output_ranks.push_back(output.dim());
  return base;
}

const std::vector<BaseModel>& base_models() {
  static const std::vector<BaseModel> all = [] {
    torch::manual_seed(0);
    std::vector<BaseModel> models;
    for (const char* zoo : {"cnn", "mlp", "resnet"}) models.push_back(base_model(zoo, zoo_file(zoo), {1, 8, 8}));
    models.push_back(base_model("bn_dropout_residual", saved(bn_dropout_residual()), {3, 8, 8}));
    models.push_back(base_model("tuple_output", saved(tuple_output()), {20}));
    models.push_back(base_model("tied_weights", saved(tied_weights()), {16}));
    models.push_back(base_model("traced_conv", saved(traced_conv()), {2, 8, 8}));
    return models;
  }();
  return all;
}

// ------------------------------------------------------------------ parameters and buffers
// Each mutation returns what it did, for the trace; empty when the model offered nothing to do it on.

struct TensorSlot {
  jit::Module owner;
  std::string name;
  std::string path;  // "fc.weight"

  torch::Tensor get() const { return owner.attr(name).toTensor(); }
  void set(const torch::Tensor& value) const { owner._ivalue()->setAttr(name, value); }
};

std::vector<TensorSlot> tensor_slots(const jit::Module& model) {
  std::vector<TensorSlot> slots;
  for (const jit::NameModule& module : model.named_modules()) {
    const std::string prefix = module.name.empty() ? "" : module.name + ".";
    for (const auto& p : module.value.named_parameters(/*recurse=*/false)) {
      slots.push_back({module.value, p.name, prefix + p.name});
    }
    for (const auto& b : module.value.named_buffers(/*recurse=*/false)) {
      slots.push_back({module.value, b.name, prefix + b.name});
    }
  }
  return slots;
}

std::string describe(const torch::Tensor& t) {
  return fmt::format("{} {} strides {}", c10::toString(t.scalar_type()), c10::str(t.sizes()), c10::str(t.strides()));
}

std::string share_one_storage(Program& program, const jit::Module& model) {
  std::vector<TensorSlot> slots;
  for (const TensorSlot& slot : tensor_slots(model)) {
    if (slot.get().scalar_type() == torch::kFloat) slots.push_back(slot);
  }
  if (slots.empty()) return "";
  std::rotate(slots.begin(), slots.begin() + static_cast<std::ptrdiff_t>(program.pick(slots.size())), slots.end());
  static constexpr const char* kLayouts[] = {"packed", "gapped", "overlapping"};
  const uint8_t layout = program.byte() % std::size(kLayouts);
  std::vector<int64_t> offsets;
  int64_t size = 0;
  for (const TensorSlot& slot : slots) {
    const int64_t numel = slot.get().numel();
    offsets.push_back(layout == 2 ? static_cast<int64_t>(program.byte()) : size);
    size = std::max(size, offsets.back() + numel + (layout == 1 ? program.byte() % 17 : 0));
  }
  const c10::Storage storage = torch::zeros({size}).storage();
  for (size_t i = 0; i < slots.size(); ++i) {
    const torch::Tensor value = slots[i].get();
    torch::Tensor view =
        torch::empty({0}, value.options()).set_(storage, offsets[i], value.sizes(), value.contiguous().strides());
    view.copy_(value);
    slots[i].set(view.requires_grad_(value.requires_grad()));
  }
  return fmt::format("one storage: {} float32 tensors from {} on, {}, {} elements", slots.size(), slots[0].path,
                     kLayouts[layout], size);
}

std::string tie(Program& program, const jit::Module& model) {
  const std::vector<TensorSlot> slots = tensor_slots(model);
  if (slots.empty()) return "";
  const TensorSlot& kept = slots[program.pick(slots.size())];
  std::vector<TensorSlot> same_shape;
  for (const TensorSlot& slot : slots) {
    if (slot.get().sizes() == kept.get().sizes() && !slot.get().is_same(kept.get())) same_shape.push_back(slot);
  }
  if (same_shape.empty()) return "";
  const TensorSlot& tied = same_shape[program.pick(same_shape.size())];
  tied.set(kept.get());
  return fmt::format("tie: {} is {}", tied.path, kept.path);
}

std::vector<int64_t> shape(Program& program) {
  std::vector<int64_t> sizes(program.byte() % 5);
  for (int64_t& size : sizes) size = program.byte() % 9;
  return sizes;
}

// The same values, strided otherwise: transposed in memory, every other element of a wider
// tensor, or one value expanded (stride 0).
torch::Tensor restrided(Program& program, const torch::Tensor& value) {
  const uint8_t how = program.byte() % 3;
  if (how == 0 && value.dim() >= 2) return value.transpose(-2, -1).contiguous().transpose(-2, -1);
  if (how == 2 || value.dim() == 0) return torch::randn({}).to(value.scalar_type()).expand(value.sizes());
  std::vector<int64_t> wide = value.sizes().vec();
  wide.back() *= 2;
  torch::Tensor every_other = torch::zeros(wide, value.options()).slice(-1, 0, wide.back(), 2);
  every_other.copy_(value);
  return every_other;
}

torch::Tensor without_elements(Program& program, const torch::Tensor& value) {
  std::vector<int64_t> sizes = value.sizes().vec();
  if (sizes.empty()) return torch::empty({0}, value.options());
  sizes[program.pick(sizes.size())] = 0;
  return torch::empty(sizes, value.options());
}

torch::Tensor with_non_finite(Program& program, const torch::Tensor& value) {
  torch::Tensor changed = value.is_floating_point() ? value.clone() : value.to(torch::kFloat);
  if (changed.numel() == 0) return changed;
  static constexpr double kValues[] = {std::numeric_limits<double>::quiet_NaN(),
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity()};
  const int count = program.byte() % 4;
  if (count == 0) return changed.fill_(kValues[0]);
  torch::Tensor flat = changed.view(-1);
  for (int i = 0; i < count; ++i) {
    flat[static_cast<int64_t>(program.pick(flat.numel()))] = kValues[program.byte() % std::size(kValues)];
  }
  return changed;
}

torch::Tensor replacement(Program& program, const torch::Tensor& value) {
  switch (program.byte() % 9) {
    case 0: return torch::randn(shape(program)).to(value.scalar_type());
    case 1: return value.to(torch::kDouble);
    case 2: return value.to(torch::kHalf);
    case 3: return value.to(torch::kBFloat16);
    case 4: return value.to(torch::kLong);
    case 5: return restrided(program, value);
    case 6: return without_elements(program, value);
    case 7: return with_non_finite(program, value);
    default: return torch::randn({}).to(value.scalar_type());  // a scalar
  }
}

std::string replace_tensor(Program& program, const jit::Module& model) {
  const std::vector<TensorSlot> slots = tensor_slots(model);
  if (slots.empty()) return "";
  const TensorSlot& slot = slots[program.pick(slots.size())];
  const torch::Tensor old = slot.get().detach();
  const torch::Tensor replaced = replacement(program, old);
  slot.set(replaced);
  return fmt::format("replace {}: {} -> {}", slot.path, describe(old), describe(replaced));
}

// ----------------------------------------------------------------------------------- graphs

bool is_tensor(const jit::Value* value) { return value->type()->cast<c10::TensorType>() != nullptr; }

std::vector<size_t> tensor_inputs(const jit::Node* node) {
  std::vector<size_t> indices;
  for (size_t i = 0; i < node->inputs().size(); ++i) {
    if (is_tensor(node->input(i))) indices.push_back(i);
  }
  return indices;
}

// Every node of `block`, those of nested blocks after the node holding them.
void collect_nodes(jit::Block* block, std::vector<jit::Node*>& nodes) {
  for (jit::Node* node : block->nodes()) {
    nodes.push_back(node);
    for (jit::Block* inner : node->blocks()) collect_nodes(inner, nodes);
  }
}

// Every method graph of every module type of `model`.
std::vector<std::shared_ptr<jit::Graph>> method_graphs(const jit::Module& model) {
  std::vector<std::shared_ptr<jit::Graph>> graphs;
  std::set<const c10::ClassType*> seen;
  for (const jit::Module& module : model.modules()) {
    if (!seen.insert(module.type().get()).second) continue;
    for (jit::Function* method : module.type()->methods()) graphs.push_back(jit::toGraphFunction(*method).graph());
  }
  return graphs;
}

std::vector<jit::Node*> all_nodes(const jit::Module& model) {
  std::vector<jit::Node*> nodes;
  for (const auto& graph : method_graphs(model)) collect_nodes(graph->block(), nodes);
  return nodes;
}

template <typename Predicate>
jit::Node* pick_node(Program& program, const jit::Module& model, Predicate&& eligible) {
  std::vector<jit::Node*> nodes = all_nodes(model);
  nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](jit::Node* n) { return !eligible(n); }), nodes.end());
  return nodes.empty() ? nullptr : nodes[program.pick(nodes.size())];
}

// "aten::conv2d"; a list by its first user, "prim::ListConstruct (input 3 of aten::conv2d)".
std::string kind(const jit::Node* node) {
  const std::string own = node->kind().toQualString();
  if (node->kind() != c10::prim::ListConstruct || node->output()->uses().empty()) return own;
  const jit::Use& use = node->output()->uses()[0];
  return fmt::format("{} (input {} of {})", own, use.offset, use.user->kind().toQualString());
}

std::string swap_inputs(Program& program, const jit::Module& model) {
  jit::Node* node = pick_node(program, model, [](jit::Node* n) { return tensor_inputs(n).size() >= 2; });
  if (!node) return "";
  const std::vector<size_t> inputs = tensor_inputs(node);
  const size_t a = inputs[program.pick(inputs.size())], b = inputs[program.pick(inputs.size())];
  jit::Value* first = node->input(a);
  node->replaceInput(a, node->input(b));
  node->replaceInput(b, first);
  return fmt::format("swap inputs {} and {} of {}", a, b, kind(node));
}

// The graph's Tensor inputs and the Tensor outputs of nodes that always run before `node`, in
// its scope.
std::vector<jit::Value*> dominating_tensors(jit::Node* node) {
  std::vector<jit::Value*> values;
  jit::Graph* graph = node->owningGraph();
  for (jit::Value* input : graph->inputs()) {
    if (is_tensor(input)) values.push_back(input);
  }
  std::vector<jit::Node*> nodes;
  collect_nodes(graph->block(), nodes);
  for (jit::Node* other : nodes) {
    if (other == node || !node->isDominatedBy(other)) continue;
    for (jit::Value* output : other->outputs()) {
      if (is_tensor(output)) values.push_back(output);
    }
  }
  return values;
}

std::string reroute_input(Program& program, const jit::Module& model) {
  jit::Node* node = pick_node(program, model, [](jit::Node* n) { return !tensor_inputs(n).empty(); });
  if (!node) return "";
  const std::vector<size_t> inputs = tensor_inputs(node);
  const std::vector<jit::Value*> values = dominating_tensors(node);
  const size_t index = inputs[program.pick(inputs.size())];
  jit::Value* value = values[program.pick(values.size())];  // never empty: the node's own input dominates it
  node->replaceInput(index, value);
  return fmt::format("input {} of {} reads %{} ({})", index, kind(node), value->debugName(),
                     value->node()->kind().toQualString());
}

bool is_int(const jit::Value* value) {
  return value->type()->kind() == c10::TypeKind::IntType && value->node()->kind() == c10::prim::Constant;
}

bool is_int_list(const jit::Value* value) {
  const auto kind = value->node()->kind();
  const bool constant_or_built = kind == c10::prim::Constant || kind == c10::prim::ListConstruct;
  return *value->type() == *c10::ListType::ofInts() && constant_or_built;
}

std::vector<size_t> int_inputs(const jit::Node* node) {
  std::vector<size_t> indices;
  for (size_t i = 0; i < node->inputs().size(); ++i) {
    if (is_int(node->input(i)) || is_int_list(node->input(i))) indices.push_back(i);
  }
  return indices;
}

// As many elements as the list had, or 0 to 4.
size_t list_length(Program& program, const jit::Value* list) {
  const uint8_t b = program.byte();
  if (b >= 0x80) return b % 5;
  if (list->node()->kind() == c10::prim::ListConstruct) return list->node()->inputs().size();
  return jit::toIValue(list)->toIntVector().size();
}

std::string change_int_constant(Program& program, const jit::Module& model) {
  jit::Node* node = pick_node(program, model, [](jit::Node* n) { return !int_inputs(n).empty(); });
  if (!node) return "";
  const std::vector<size_t> inputs = int_inputs(node);
  const size_t index = inputs[program.pick(inputs.size())];
  jit::Value* old = node->input(index);
  c10::IValue value;
  if (is_int(old)) {
    value = program.integer();
  } else {
    std::vector<int64_t> list(list_length(program, old));
    for (int64_t& element : list) element = program.integer();
    value = list;
  }
  jit::WithInsertPoint insert_before(node);
  node->replaceInput(index, node->owningGraph()->insertConstant(value));
  return fmt::format("input {} of {} is {}", index, kind(node), c10::str(value));
}

std::string delete_node(Program& program, const jit::Module& model) {
  jit::Node* node = pick_node(program, model, [](jit::Node* n) {
    return n->outputs().size() == 1 && is_tensor(n->output()) && n->blocks().empty() && !tensor_inputs(n).empty();
  });
  if (!node) return "";
  const std::vector<size_t> inputs = tensor_inputs(node);
  const size_t index = inputs[program.pick(inputs.size())];
  const std::string what = fmt::format("delete {}, its uses reading its input {}", kind(node), index);
  node->output()->replaceAllUsesWith(node->input(index));
  node->destroy();
  return what;
}

std::string duplicate_node(Program& program, const jit::Module& model) {
  jit::Node* node = pick_node(program, model, [](jit::Node* n) {
    return !n->outputs().empty() && n->kind() != c10::prim::Constant;
  });
  if (!node) return "";
  jit::Node* clone = node->owningGraph()->createClone(node, [](jit::Value* v) { return v; });
  clone->insertAfter(node);
  const std::vector<size_t> inputs = tensor_inputs(clone);
  bool chained = false;
  if (program.byte() % 2 == 1 && !inputs.empty()) {
    for (jit::Value* output : node->outputs()) {
      if (!is_tensor(output)) continue;
      clone->replaceInput(inputs[program.pick(inputs.size())], output);
      chained = true;
      break;
    }
  }
  for (size_t i = 0; i < node->outputs().size(); ++i) {
    node->output(i)->replaceAllUsesAfterNodeWith(clone, clone->output(i));
  }
  return fmt::format("duplicate {}{}", kind(node), chained ? ", chained" : "");
}

std::string mutate(Program& program, const jit::Module& model) {
  torch::NoGradGuard no_grad;
  switch (program.byte() % 8) {
    case 0: return share_one_storage(program, model);
    case 1: return tie(program, model);
    case 2: return replace_tensor(program, model);
    case 3: return swap_inputs(program, model);
    case 4: return reroute_input(program, model);
    case 5: return change_int_constant(program, model);
    case 6: return delete_node(program, model);
    default: return duplicate_node(program, model);
  }
}

// Throws what lint finds wrong in any method's graph.
void lint(const jit::Module& model) {
  for (const auto& graph : method_graphs(model)) graph->lint();
}

// AFTERBURNER_FUZZ_TRACE=1: each input's mutations and each step's outcome on stderr, to see
// what an input in findings/ does.
void trace(const std::string& line) {
  static const bool enabled = std::getenv("AFTERBURNER_FUZZ_TRACE") != nullptr;
  if (enabled) std::fprintf(stderr, "model_graph: %s\n", one_line(line).c_str());
}

// The mutated model as a file LibTorch loads back, or nothing if it does not.
std::optional<jit::Module> round_trip(const jit::Module& mutated, const fs::path& file) {
  try {
    lint(mutated);
    testing::write_file(file, saved(mutated));
    return infer::load_model(file.string());
  } catch (const std::exception& e) {
    trace(std::string("skipped, the mutated model does not save and load: ") + first_line(e));
    return std::nullopt;
  }
}

// ------------------------------------------------------------------ what afterburner does

bool same_results(const std::vector<torch::Tensor>& expected, const std::vector<torch::Tensor>& got) {
  if (expected.size() != got.size()) return false;
  for (size_t i = 0; i < expected.size(); ++i) {
    const torch::Tensor &a = expected[i], &b = got[i];
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
    const bool equal = a.is_floating_point() ? torch::allclose(a, b, 0.0, 0.0, /*equal_nan=*/true) : torch::equal(a, b);
    if (!equal) return false;
  }
  return true;
}

// `other` computes what `reference` does, bit for bit, or both refuse; otherwise a finding
// naming them. Both must have been called alike before (here, not at all), so that the graph
// executor's profiling gives both the same plan.
void expect_same_forward(jit::Module& reference, jit::Module& other, const torch::Tensor& x,
                         const std::string& reference_name, const std::string& other_name) {
  std::vector<torch::Tensor> expected;
  try {
    expected = forward(reference, x);
  } catch (const std::exception&) {
    fuzz::expect_no_crash([&] { forward(other, x); });
    return;
  }
  try {
    if (!same_results(expected, forward(other, x))) {
      fuzz::finding(other_name + " computes other outputs than " + reference_name);
    }
  } catch (const std::exception& e) {
    fuzz::finding(other_name + " fails where " + reference_name + " runs: " + first_line(e));
  }
}

void check_copy(jit::Module& model, const torch::Tensor& x) {
  jit::Module copy = infer::copy_model(model);
  expect_same_forward(model, copy, x, "the model", "copy_model: the copy");
}

void optimize(jit::Module& model, infer::Precision precision, const std::vector<torch::Tensor>& inputs) {
  infer::OptimizeResult result = infer::optimize(model, infer::OptimizeOptions().precision(precision));
  jit::Module prepared = infer::prepare_for_inference(result.model);
  for (const torch::Tensor& x : inputs) forward(prepared, x);
  infer::verify_outputs(model, prepared, {inputs.back()});
}

// ModelService loading the file as `afterburner serve` does: load, eval, prepare, warm-up.
void serve_file(const BaseModel& base, const fs::path& file) {
  serve::ModelConfig config;
  config.name = "model";
  config.config_file = file.parent_path() / "config.toml";
  config.model_file = file;
  config.max_batch_size = 3;
  config.inputs = {{"input", serve::DataType::FP32, base.sample_shape}};
  for (size_t i = 0; i < base.output_ranks.size(); ++i) {
    std::vector<int64_t> any_size(static_cast<size_t>(std::max<int64_t>(base.output_ranks[i] - 1, 0)), -1);
    config.outputs.push_back({fmt::format("output{}", i), serve::DataType::FP32, any_size});
  }
  serve::ModelService service(serve::Repository{file.parent_path(), {config}});
}

// sketch_script's module in memory runs as its file, the one `afterburner sketch` writes, does
// (both are called in the same order).
void sketch_and_run(const jit::Module& model, const sketch::SketchConfig& config,
                    const std::vector<torch::Tensor>& inputs) {
  jit::Module sketched = infer::copy_model(model);
  sketch::sketch_script(sketched, config);
  std::istringstream file(saved(sketched));
  jit::Module reloaded = jit::load(file);
  for (const torch::Tensor& x : inputs) {
    expect_same_forward(reloaded, sketched, x, "its saved file", "sketch_script: the sketched module in memory");
  }
}

// One step of what afterburner does, traced: "ran" or the first line of why it refused, and how
// long it took (which step a timeout in findings/ spends its time in).
template <typename Run>
void step(const std::string& name, Run&& run) {
  const auto start = std::chrono::steady_clock::now();
  const std::string refusal = fuzz::expect_no_crash(run);
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  trace(fmt::format("{} ({:.1f} s): {}", name, seconds.count(), refusal.empty() ? "ran" : "refused: " + refusal));
}

void run_everything(const BaseModel& base, jit::Module& model, const fs::path& file,
                    const sketch::SketchConfig& sketching) {
  step("copy_model", [&] { check_copy(model, base.inputs.back()); });
  for (auto precision : {infer::Precision::fp32, infer::Precision::bf16, infer::Precision::int8}) {
    step("optimize " + infer::to_string(precision), [&] { optimize(model, precision, base.inputs); });
  }
  step("serve", [&] { serve_file(base, file); });
  step("sketch", [&] { sketch_and_run(model, sketching, base.inputs); });
}

// ------------------------------------------------------------------------------------ seeds

// One program per base model without mutations, and one per mutation kind (and per kind of
// replaced tensor), each on another base model.
void write_seeds(const fs::path& dir) {
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds = {
      {"base-cnn", {0, 0}},
      {"base-mlp", {1, 0}},
      {"base-resnet", {2, 0}},
      {"base-bn_dropout_residual", {3, 0}},
      {"base-tuple_output", {4, 1}},
      {"base-tied_weights", {5, 2}},
      {"base-traced_conv", {6, 9}},
      {"one_storage-resnet-packed", {2, 0, 0, 0, 3, 0}},
      {"one_storage-tied_weights-overlapping", {5, 0, 0, 0, 1, 2, 0, 8, 16, 3, 40, 5}},
      {"tie-traced_conv", {6, 0, 1, 0, 1, 0, 0}},
      {"replace-cnn-shape", {0, 0, 2, 0, 0, 0, 2, 3, 4}},
      {"replace-bn_dropout_residual-double", {3, 0, 2, 0, 3, 1}},
      {"replace-tuple_output-half", {4, 0, 2, 0, 1, 2}},
      {"replace-traced_conv-bfloat16", {6, 0, 2, 0, 2, 3}},
      {"replace-tied_weights-int64", {5, 0, 2, 0, 0, 4}},
      {"replace-resnet-transposed", {2, 0, 2, 0, 0, 5, 0}},
      {"replace-bn_dropout_residual-expanded", {3, 0, 2, 0, 5, 5, 2}},
      {"replace-cnn-no_elements", {0, 0, 2, 0, 1, 6, 0, 0}},
      {"replace-bn_dropout_residual-nan_inf", {3, 0, 2, 0, 4, 7, 2, 0, 1, 1, 0, 2, 2}},
      {"swap-cnn", {0, 0, 3, 0, 4, 0, 0, 0, 1}},
      {"reroute-tuple_output", {4, 0, 4, 0, 3, 0, 0, 0, 1}},
      {"int_constant-cnn-padding_zero", {0, 0, 5, 0, 1, 0, 0, 0}},
      {"int_constant-resnet-padding_large", {2, 0, 5, 0, 1, 0, 0, 10}},
      {"int_constant-traced_conv-stride_resized", {6, 0, 5, 0, 10, 0, 0, 0x85, 0xc1, 0xc2, 0xc3}},
      {"delete-bn_dropout_residual", {3, 0, 6, 0, 2, 0, 0}},
      {"duplicate-mlp-chained", {1, 0, 7, 0, 5, 1, 0, 0}},
      {"duplicate-tied_weights-parallel", {5, 0, 7, 0, 3, 0}},
  };
  fs::create_directories(dir);
  for (const auto& [name, program] : seeds) {
    testing::write_file(dir / name, std::string(program.begin(), program.end()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  afterburner::fuzz::write_seeds_if_asked(*argc, *argv, "--write-seeds=", write_seeds);
  base_models();  // built once, before the first input is timed
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const afterburner::testing::TempDir dir;
  Program program(data, size);
  const BaseModel& base = base_models()[program.byte() % base_models().size()];
  const uint8_t sketching = program.byte();
  const auto sketch_config = sketch::SketchConfig().rank(1 + sketching % 8).terms(1 + (sketching >> 3) % 2);
  torch::manual_seed(0);

  trace("base model " + base.name);
  std::istringstream file(base.file);
  jit::Module mutated = jit::load(file);
  for (int i = 0; i < kMaxMutations && !program.done(); ++i) {
    const std::string what = mutate(program, mutated);
    trace(what.empty() ? "a mutation found nothing to change" : what);
  }
  const fs::path path = dir / "model.pt";
  std::optional<jit::Module> model = round_trip(mutated, path);
  if (model) run_everything(base, *model, path, sketch_config);
  return 0;
}
