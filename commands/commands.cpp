#include "commands/commands.h"

namespace cast {

const std::vector<Command>& commands() {
  static const std::vector<Command> list = {
      {"train", "train a Transformer on an LRA task (no options: a small CAST model on short ListOps)", command_train},
      {"compare", "train several mechanisms (or values of a setting) and seeds on a task; results table and figure",
       command_compare},
      {"eval", "evaluate a checkpoint on its task's validation and test splits", command_eval},
      {"data", "generate ListOps, Pathfinder or Path-X in the LRA release layout", command_data},
      {"clusters", "render a CAST model's clusters over an image input (SVG, with a legend)", command_clusters},
      {"attention", "draw a full-attention model's weights for a few queries against clustered attention's (SVG)",
       command_attention},
      {"plot", "plot one run's curves, or several runs side by side (SVG)", command_plot},
      {"info", "build options, devices and their memory", command_info},
      {"demo", "one attention layer (or one op) step by step: forward, backward, gradient check", command_demo},
      {"bench", "time and peak memory of attention layers and training steps", command_bench},
      {"layer", "one attention layer forward+backward on a safetensors file (the audit interface)", command_layer},
  };
  return list;
}

}  // namespace cast
