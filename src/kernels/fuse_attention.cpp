#include "fuse_attention.h"

#include <fmt/format.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/ir/ir.h>

#include <memory>
#include <string>
#include <vector>

#include "afterburner/kernels/fuse.h"
#include "afterburner/kernels/script_rewrites.h"

namespace afterburner::kernels {
namespace {

namespace jit = torch::jit;

// F.multi_head_attention_forward's computation, for the cases afterburner::attention computes as
// it does: projections packed in in_proj_weight (split as _in_projection_packed splits them), the
// heads through one fused attention, out_proj; in training, dropout of the weights from the same
// draws as MHA's (afterburner::dropout); the weights, when asked for, from the unfused softmax,
// dropped alike (a caller that drops them lets dead-code elimination drop them). Masks as MHA reads
// them: bool = true where a key is ignored, float = added; key_padding_mask [N, S]; attn_mask
// [L, S] or [N * heads, L, S].
const char* const kSource = R"(
def unfusable(add_zero_attn: bool, bias_k: Optional[Tensor], bias_v: Optional[Tensor], embed_dim: int, num_heads: int,
              batch_first: bool, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
              attn_mask: Optional[Tensor]) -> bool:
    # What MHA computes otherwise (extra keys) or refuses (its own errors).
    if add_zero_attn or bias_k is not None or bias_v is not None:
        return True
    if num_heads <= 0 or embed_dim % num_heads != 0:
        return True
    if query.dim() != 3 or key.dim() != 3 or key.size() != value.size():
        return True
    if query.size(2) != embed_dim or key.size(2) != embed_dim:
        return True
    batch = query.size(0) if batch_first else query.size(1)
    q_len = query.size(1) if batch_first else query.size(0)
    k_len = key.size(1) if batch_first else key.size(0)
    if (key.size(0) if batch_first else key.size(1)) != batch:
        return True
    if key_padding_mask is not None:
        if key_padding_mask.size() != [batch, k_len]:
            return True
        if key_padding_mask.dtype != torch.bool and (attn_mask is not None or key_padding_mask.dtype != query.dtype):
            return True
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and attn_mask.dtype != query.dtype:
            return True
        if attn_mask.size() != [q_len, k_len] and attn_mask.size() != [batch * num_heads, q_len, k_len]:
            return True
    return False


def project(x: Tensor, weight: Tensor, bias: Optional[Tensor], part: int) -> Tensor:
    return torch.linear(x, weight.chunk(3)[part], None if bias is None else bias.chunk(3)[part])


def split_heads(x: Tensor, batch: int, length: int, num_heads: int, batch_first: bool) -> Tensor:
    if batch_first:
        return x.reshape([batch, length, num_heads, -1]).transpose(1, 2)
    return x.reshape([length, batch, num_heads, -1]).permute([1, 2, 0, 3])


def attend(query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor], need_weights: bool,
           attn_mask: Optional[Tensor], average_attn_weights: bool, in_proj_weight: Tensor,
           in_proj_bias: Optional[Tensor], out_proj_weight: Tensor, out_proj_bias: Optional[Tensor], num_heads: int,
           batch_first: bool, training: bool, dropout: float) -> Tuple[Tensor, Optional[Tensor]]:
    embed_dim = query.size(2)
    batch = query.size(0) if batch_first else query.size(1)
    q_len = query.size(1) if batch_first else query.size(0)
    k_len = key.size(1) if batch_first else key.size(0)
    if key is value and query is key:
        packed = torch.linear(query, in_proj_weight, in_proj_bias).chunk(3, -1)
        q, k, v = packed[0], packed[1], packed[2]
    else:
        q = project(query, in_proj_weight, in_proj_bias, 0)
        k = project(key, in_proj_weight, in_proj_bias, 1)
        v = project(value, in_proj_weight, in_proj_bias, 2)
    q = split_heads(q, batch, q_len, num_heads, batch_first)
    k = split_heads(k, batch, k_len, num_heads, batch_first)
    v = split_heads(v, batch, k_len, num_heads, batch_first)
    # MHA's mask, true (bool) or -inf (float) where a key is ignored.
    ignored: Optional[Tensor] = None
    if attn_mask is not None:
        ignored = attn_mask.view([batch, num_heads, q_len, k_len]) if attn_mask.dim() == 3 else attn_mask
    if key_padding_mask is not None:
        padding = key_padding_mask.view([batch, 1, 1, k_len])
        if ignored is None:
            ignored = padding
        elif ignored.dtype == torch.bool:
            ignored = ignored.logical_or(padding)
        else:
            ignored = ignored.masked_fill(padding, float("-inf"))
    mask: Optional[Tensor] = None
    if ignored is not None:
        mask = ignored.logical_not() if ignored.dtype == torch.bool else ignored
    # MHA's dropout of its weights, drawn as it draws it: the noise of a [N * heads, L, S] tensor of
    # its weights' dtype, at the same point of the generator's sequence.
    dropped: Optional[Tensor] = None
    if training and dropout > 0.0:
        ones = torch.ones([batch * num_heads, q_len, k_len], dtype=query.dtype)
        dropped = afterburner.dropout(ones, dropout, True).view([batch, num_heads, q_len, k_len])
    out = afterburner.attention(q, k, v, mask, False, None, dropped)
    if batch_first:
        out = out.transpose(1, 2).reshape([batch, q_len, embed_dim])
    else:
        out = out.permute([2, 0, 1, 3]).reshape([q_len, batch, embed_dim])
    out = torch.linear(out, out_proj_weight, out_proj_bias)
    if not need_weights:
        return out, None
    scores = torch.matmul(q / float(q.size(3)) ** 0.5, k.transpose(-2, -1))
    if ignored is not None:
        scores = scores.masked_fill(ignored, float("-inf")) if ignored.dtype == torch.bool else scores + ignored
    probabilities = torch.softmax(scores, -1)
    if dropped is not None:
        probabilities = probabilities * dropped
    if average_attn_weights:
        return out, probabilities.sum(1) / num_heads
    return out, probabilities
)";

// The helpers' graphs, their own calls inlined; compiled once.
struct Helpers {
  std::shared_ptr<jit::Graph> unfusable, attend;
};

const Helpers& helpers() {
  static const Helpers compiled = [] {
    // The resolver knows no dtype names: torch.bool is its number, as TorchScript's dtypes are.
    std::string source = kSource;
    const std::string kBool = "torch.bool";
    for (size_t at = source.find(kBool); at != std::string::npos; at = source.find(kBool, at)) {
      source.replace(at, kBool.size(), std::to_string(static_cast<int>(c10::ScalarType::Bool)));
    }
    jit::CompilationUnit unit;
    unit.define(c10::nullopt, source, resolver_with_afterburner_ops(), nullptr);
    auto graph_of = [&](const char* name) {
      std::shared_ptr<jit::Graph> graph = jit::toGraphFunction(unit.get_function(name)).graph()->copy();
      inline_calls(*graph);
      return graph;
    };
    return Helpers{graph_of("unfusable"), graph_of("attend")};
  }();
  return compiled;
}

jit::Value* attribute(jit::Graph& graph, jit::Value* module, const char* name) {
  const auto type = module->type()->expect<c10::ClassType>();
  if (type->hasConstant(name)) return graph.insertConstant(type->getConstant(name));
  return graph.insertGetAttr(module, name);
}

// The (output, weights) of a call or of the helper, as two values.
std::vector<jit::Value*> unpacked(jit::Graph& graph, jit::Value* pair) {
  return graph.insertNode(graph.createTupleUnpack(pair))->outputs().vec();
}

// `call` moved into the first block of `if unfusable(...)`, afterburner's form in the second.
void branch_on_fusable(jit::Node* call, jit::Graph& graph) {
  jit::Value* self = call->input(0);
  const auto inputs = call->inputs();  // self, query, key, value, key_padding_mask, need_weights, attn_mask, average
  jit::WithInsertPoint at_the_call(call);
  std::vector<jit::Value*> checked;
  for (const char* name :
       {"add_zero_attn", "bias_k", "bias_v", "embed_dim", "num_heads", "batch_first"}) {
    checked.push_back(attribute(graph, self, name));
  }
  for (const size_t argument : {1, 2, 3, 4, 6}) checked.push_back(inputs[argument]);
  jit::Value* fallback = jit::insertGraph(graph, *helpers().unfusable, checked).at(0);

  jit::Node* branch = graph.insertNode(graph.create(c10::prim::If, {fallback}, 2));
  const auto pair = call->output()->type()->expect<c10::TupleType>()->elements();
  branch->output(0)->setType(pair.at(0));
  branch->output(1)->setType(pair.at(1));
  call->output()->replaceAllUsesWith(graph.insertNode(graph.createTuple(branch->outputs()))->output());

  jit::Block* unfused = branch->addBlock();
  {
    jit::WithInsertPoint in_unfused(unfused->return_node());
    call->moveBefore(unfused->return_node());
    for (jit::Value* value : unpacked(graph, call->output())) unfused->registerOutput(value);
  }

  jit::Block* fused = branch->addBlock();
  jit::WithInsertPoint in_fused(fused->return_node());
  jit::Value* out_proj = graph.insertGetAttr(self, "out_proj");
  std::vector<jit::Value*> arguments(inputs.begin() + 1, inputs.end());
  for (jit::Value* value : {attribute(graph, self, "in_proj_weight"), attribute(graph, self, "in_proj_bias"),
                            graph.insertGetAttr(out_proj, "weight"), graph.insertGetAttr(out_proj, "bias"),
                            attribute(graph, self, "num_heads"), attribute(graph, self, "batch_first"),
                            attribute(graph, self, "training"), attribute(graph, self, "dropout")}) {
    arguments.push_back(value);
  }
  for (jit::Value* value : unpacked(graph, jit::insertGraph(graph, *helpers().attend, arguments).at(0))) {
    fused->registerOutput(value);
  }
}

void read_autocast_as_enabled(jit::Node* node) {
  for (jit::Block* block : node->blocks()) {
    for (auto it = block->nodes().begin(); it != block->nodes().end();) read_autocast_as_enabled(*it++);
  }
  if (node->kind() != c10::Symbol::fromQualString("aten::is_autocast_enabled")) return;
  jit::WithInsertPoint here(node);
  node->output()->replaceAllUsesWith(node->owningGraph()->insertConstant(true));
  node->destroy();
}

// LibTorch 1.13's fast paths of nn.MultiheadAttention, TransformerEncoderLayer and
// TransformerEncoder (one native op, in evaluation without grad) test torch.is_autocast_enabled(),
// CUDA's autocast only: under CPU autocast they take the native op, which then mixes bfloat16 and
// float32 and fails. `call` (a forward of one of them) inlined with that test read as true, so that
// the path the module trains with, which computes the same function, runs instead.
void inline_without_fast_paths(jit::Node* call) {
  jit::Node* const before = call->prev();
  jit::Node* const after = call->next();
  auto* method = jit::tryToGraphFunction(call->input(0)->type()->expect<c10::ClassType>()->getMethod("forward"));
  jit::inlineCallTo(call, method, method->graph().get());
  for (jit::Node* node = before->next(); node != after;) {
    jit::Node* const next = node->next();
    read_autocast_as_enabled(node);
    node = next;
  }
}

// Replaces `call` by `if unfusable(...): <call> else: attend(...)`, the call inlined in place. The
// branch yields the output and the weights apart, so that a caller dropping the weights lets
// dead-code elimination drop their computation.
void rewrite(jit::Node* call, jit::Graph& graph) {
  branch_on_fusable(call, graph);
  inline_without_fast_paths(call);  // after the insertion points above are gone: inlining destroys the call
}

// One pass over `block` and the blocks in it; true if it inlined a call (whose body may hold more).
bool rewrite_attention_calls_once(jit::Block* block, AttentionRewrite& result) {
  bool inlined = false;
  for (auto it = block->nodes().begin(); it != block->nodes().end();) {
    jit::Node* node = *it++;
    for (jit::Block* inner : node->blocks()) inlined = rewrite_attention_calls_once(inner, result) || inlined;
    if (node->kind() != c10::prim::CallMethod || node->s(c10::attr::name) != "forward") continue;
    const auto type = node->input(0)->type()->cast<c10::ClassType>();
    if (!type) continue;
    if (is_torch_nn(type, "TransformerEncoderLayer") || is_torch_nn(type, "TransformerEncoder")) {
      inline_without_fast_paths(node);
      inlined = true;
    } else if (is_torch_nn(type, "MultiheadAttention")) {
      const std::string reason = why_not_rewritable_attention(type);
      if (reason.empty()) {
        rewrite(node, *block->owningGraph());
        ++result.fused;
      } else {
        result.notices.push_back(fmt::format("nn.MultiheadAttention left unfused: {}", reason));
      }
    }
  }
  return inlined;
}

}  // namespace

AttentionRewrite rewrite_attention_calls(jit::Block* block) {
  AttentionRewrite result;
  while (rewrite_attention_calls_once(block, result)) {
  }
  return result;
}

}  // namespace afterburner::kernels
