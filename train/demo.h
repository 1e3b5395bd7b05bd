#pragma once
// `cast demo [walk]`: one attention layer (or one op) walked step by step on a tiny input,
// forward and backward, with every intermediate printed (train/demo.cpp).
#include <string>
#include <vector>

namespace cast {
// No walk: lists the walks. A walk: prints it; the exit code is 1 when one of its checks fails.
int command_demo(const std::vector<std::string>& argv);
}  // namespace cast
