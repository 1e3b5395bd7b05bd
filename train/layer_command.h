#pragma once
#include <string>
#include <vector>

namespace cast {
// `cast layer`: one attention layer forward and backward on tensors from a safetensors file,
// writing the output, every gradient and the cluster indices to another (the audit interface).
int command_layer(const std::vector<std::string>& argv);
}  // namespace cast
