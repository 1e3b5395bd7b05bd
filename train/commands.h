#pragma once
// The commands of the `cast` binary. Each takes the arguments after its name and returns the
// exit code; errors are thrown as cast::Error and reported by main() as one line.
#include <string>
#include <vector>

namespace cast {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& argv);
};

const std::vector<Command>& commands();

}  // namespace cast
