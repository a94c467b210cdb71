// bf16 training weights for a TorchScript model (IPEX's bf16 weights with fp32 masters): the
// weights its forward only hands to a convolution, linear layer or matrix product are read from
// bfloat16 copies that the flat optimizer keeps beside their float32 parameters.
//
//   kernels::FlatSGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
//   train::Bf16Weights weights(model, optimizer);    // chooses the weights, makes their copies
//   {
//     auto reading = weights.in_forward();            // the model's slots hold the copies
//     AutocastGuard autocast(Precision::bf16);
//     loss = criterion(model.forward(x), y);
//   }                                                 // the slots hold the float32 parameters again
//   loss.backward();                                  // gradients reach the copies, in bf16
//   optimizer.step();                                 // steps the parameters, rewrites the copies
//
// Why: under bf16 autocast those ops cast each weight to bf16 in every forward and its gradient
// back to float32 in every backward, two passes over every weight and its gradient per step (and
// two ops each, which small models feel most). Here neither runs: the step reads the bf16
// gradient and writes the copy in its own pass. The bits are autocast's: a copy is the
// round-to-nearest-even cast autocast makes, and a weight qualifies only if the forward graph
// reads it exactly once, outside loops, as an argument the op casts to bf16 under autocast, so its
// gradient is that op's bf16 gradient alone, which autocast's backward would widen exactly.
// Everything else (LayerNorm and BatchNorm weights, embeddings added, weights read twice) stays as
// it was. Evaluation and export read the float32 parameters as before.
//
// Not for gradients summed over several backward passes (accumulation: bf16 sums would round) nor
// for code that reads the parameters' gradients between backward and step (clipping, data-parallel
// reducers): the Trainer leaves the copies off in those cases.
#pragma once

#include <torch/csrc/jit/api/object.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "afterburner/kernels/flat_optim.h"
#include "afterburner/train/model.h"

namespace afterburner::train {

class Bf16Weights {
 public:
  // `model` must be a TorchScript module (a module holder gets no copies: size() is 0); both must
  // outlive this object.
  Bf16Weights(Model& model, kernels::FlatOptimizer& optimizer);

  // While one is alive the model's forward reads the copies (refreshed first if a parameter
  // changed outside a step, as a checkpoint load does).
  class InForward {
   public:
    explicit InForward(Bf16Weights& weights);
    ~InForward();
    InForward(const InForward&) = delete;
    InForward& operator=(const InForward&) = delete;

   private:
    Bf16Weights& weights_;
  };
  InForward in_forward() { return InForward(*this); }

  // Weights read from a copy, by their dotted names, and their copies (whose gradients a backward
  // fills), in the same order.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<torch::Tensor>& copies() const { return copies_; }
  size_t size() const { return names_.size(); }

 private:
  // Where the forward reads one weight: an attribute slot of a module object.
  struct Slot {
    c10::intrusive_ptr<c10::ivalue::Object> owner;
    size_t index;
    torch::Tensor parameter, copy;
  };

  kernels::FlatOptimizer& optimizer_;
  std::vector<Slot> slots_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> copies_;
};

}  // namespace afterburner::train
