#pragma once
#include <string>
#include <vector>

namespace cast {
int command_train(const std::vector<std::string>& argv);
int command_eval(const std::vector<std::string>& argv);
int command_data(const std::vector<std::string>& argv);
int command_clusters(const std::vector<std::string>& argv);
int command_plot(const std::vector<std::string>& argv);
}  // namespace cast
