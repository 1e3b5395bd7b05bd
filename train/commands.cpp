#include "train/commands.h"

#include "train/info.h"
#include "train/layer_command.h"

namespace cast {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"info", "build options, devices and their memory", command_info},
      {"demo", "one op's forward, backward and gradient check, step by step", command_demo},
      {"layer", "one attention layer forward+backward on a safetensors file (the audit interface)", command_layer},
  };
  return list;
}

}  // namespace cast
