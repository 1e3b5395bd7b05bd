#include "train/commands.h"

#include "train/info.h"

namespace cast {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"info", "build options, devices and their memory", command_info},
      {"demo", "one op's forward, backward and gradient check, step by step", command_demo},
  };
  return list;
}

}  // namespace cast
