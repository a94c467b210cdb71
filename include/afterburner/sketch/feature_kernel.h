// The random feature maps of random-feature attention (RandMultiHeadAttention, and the layers
// `afterburner sketch` puts in place of nn.MultiheadAttention).
//
//   auto kernel = afterburner::sketch::parse_feature_kernel("relu");   // FeatureKernel::relu
#pragma once

#include <string>

namespace afterburner::sketch {

// The random feature map phi: softmax (positive features whose inner products estimate
// exp(q.k / sqrt(d))) or relu (Performer's generalised ReLU kernel).
enum class FeatureKernel { softmax, relu };

// "softmax" or "relu"; anything else is a UsageError.
FeatureKernel parse_feature_kernel(const std::string& name);
std::string to_string(FeatureKernel kernel);

}  // namespace afterburner::sketch
