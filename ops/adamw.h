#pragma once
// The AdamW parameter update (decoupled weight decay), in place, no autograd:
//   m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   p −= lr · ( m̂ / (√v̂ + ε) + wd · p ),  m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t)
#include <cmath>
#include <cstdint>

#include "tensor/hd.h"
#include "tensor/tensor.h"

namespace cast::ops {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.98, eps = 1e-9, weight_decay = 0.0;
  int64_t t = 1;  // 1-based step count, for the bias corrections
};

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s);

// Gradient clipping's factor from ‖g‖² over every parameter: max_norm / ‖g‖ when
// ‖g‖ > max_norm > 0, else 1 (also for a NaN norm). Written once for the host and the GPU.
CAST_HD double clip_factor_of(double squared_norm, double max_norm) {
  const double norm = ::sqrt(squared_norm);  // ::, not ops::sqrt on tensors
  return max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
}

// The same on squared_norm (1), computed in double where the tensor lives -> (1) of its dtype.
// On a GPU the norm never goes to the host.
Tensor clip_factor(const Tensor& squared_norm, double max_norm);

}  // namespace cast::ops
