#pragma once
// Parameters with stable dotted names ("blocks.0.attention.wq"), for optimizers and checkpoints.
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cast::nn {

using ParamList = std::vector<std::pair<std::string, Tensor*>>;

class Module {
 public:
  virtual ~Module() = default;
  // Appends every parameter under `prefix`, in a fixed order.
  virtual void collect_parameters(ParamList& out, const std::string& prefix) = 0;
  ParamList parameters() {
    ParamList out;
    collect_parameters(out, "");
    return out;
  }
};

inline std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace cast::nn
