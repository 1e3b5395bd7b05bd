#pragma once
// The commands about training: each parses its options and calls the library (train/).
#include <string>
#include <vector>

namespace cast {
int command_train(const std::vector<std::string>& argv);      // train_commands.cpp
int command_eval(const std::vector<std::string>& argv);       // train_commands.cpp
int command_data(const std::vector<std::string>& argv);       // train_commands.cpp
int command_clusters(const std::vector<std::string>& argv);   // train_commands.cpp
int command_attention(const std::vector<std::string>& argv);  // attention_command.cpp
int command_plot(const std::vector<std::string>& argv);       // train_commands.cpp
int command_compare(const std::vector<std::string>& argv);    // compare_command.cpp
}  // namespace cast
