#pragma once
#include <string>
#include <vector>

namespace cast {
// `cast info`: build options, devices found and their memory.
int command_info(const std::vector<std::string>& argv);
}  // namespace cast
