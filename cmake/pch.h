// Precompiled header: the heavy third-party headers every translation unit uses.
#pragma once
#include <torch/torch.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
