#pragma once
// The commands of the `cast` binary, one file each (commands/<name>.cpp; `demo`'s walks are in
// demo/). Each takes the arguments after its name and returns the exit code; errors are thrown
// as cast::Error and reported by main() as one line.
#include <string>
#include <vector>

namespace cast {

using CommandFn = int (*)(const std::vector<std::string>& argv);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

const std::vector<Command>& commands();

int command_train(const std::vector<std::string>& argv);
int command_compare(const std::vector<std::string>& argv);
int command_eval(const std::vector<std::string>& argv);
int command_data(const std::vector<std::string>& argv);
int command_clusters(const std::vector<std::string>& argv);
int command_attention(const std::vector<std::string>& argv);
int command_plot(const std::vector<std::string>& argv);
int command_info(const std::vector<std::string>& argv);
int command_demo(const std::vector<std::string>& argv);  // demo/demo.cpp
int command_bench(const std::vector<std::string>& argv);
int command_layer(const std::vector<std::string>& argv);

}  // namespace cast
