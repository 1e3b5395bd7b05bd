#pragma once
#include <string>
#include <vector>

namespace cast {
// `cast info`: build options, devices found and their memory.
int command_info(const std::vector<std::string>& argv);
// `cast demo`: one op's forward, backward and finite-difference check, printed step by step.
int command_demo(const std::vector<std::string>& argv);
}  // namespace cast
