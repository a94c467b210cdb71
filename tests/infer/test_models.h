// Models and inputs for the infer tests: a hand-written TorchScript model with BatchNorm and
// Dropout, zoo models trained briefly on Fashion-MNIST (so logits have real margins, as
// agreement tests need), and the Fashion-MNIST images normalized as training does.
#pragma once

#include <torch/script.h>

#include <string>

namespace afterburner::testing {

// conv3x3(1->4, pad 1) - BatchNorm(4, non-trivial statistics) - ReLU - Dropout(0.5) - flatten -
// linear(4*8*8 -> 10), in training mode as a user would save it; takes [N, 1, 8, 8].
torch::jit::Module conv_bn_dropout_model();

// The zoo model, trained for a few hundred SGD steps and exported through export_torchscript.
// Computed once per process and cloned, so callers may change it.
torch::jit::Module trained_zoo_model(const std::string& name);

// The first `count` Fashion-MNIST images of the given file ("t10k" or "train"), float32
// [count, 1, 28, 28], normalized with mean 0.2860 and std 0.3530.
torch::Tensor fashion_mnist_images(const std::string& split, int64_t count);
torch::Tensor fashion_mnist_labels(const std::string& split, int64_t count);

// The model's answer to `x` under InferenceMode, as serving computes it.
torch::Tensor answer(torch::jit::Module& model, const torch::Tensor& x);

// The model's answer to `x` in double precision: a copy of it with its weights widened, and x widened.
torch::Tensor exact_answer(const torch::jit::Module& model, const torch::Tensor& x);

// How many nodes of `kind` the forward graph's top block holds.
int nodes_of_kind(const torch::jit::Module& model, const std::string& kind);

// Whether the forward graph, with method calls inlined, holds a node of `kind` ("aten::relu").
bool graph_has(const torch::jit::Module& model, const std::string& kind);

}  // namespace afterburner::testing
