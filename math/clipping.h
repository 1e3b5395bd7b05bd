#pragma once
// Gradient clipping's factor from ‖g‖² over every parameter: max_norm / ‖g‖ when
// ‖g‖ > max_norm > 0, else 1 (also for a NaN norm). Written once for the host (train/adamw.cpp,
// train/training_step.cpp) and the GPU (cuda/adamw.cu).
#include <cmath>

#include "tensor/hd.h"

namespace cast {
CAST_HD double clip_factor_of(double squared_norm, double max_norm) {
  const double norm = ::sqrt(squared_norm);
  return max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
}
}  // namespace cast
