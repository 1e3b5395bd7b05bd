#pragma once
#include <string>
#include <vector>

namespace cast {
// `cast bench attention` and `cast bench train`: median times and peak memory.
int command_bench(const std::vector<std::string>& argv);
}  // namespace cast
