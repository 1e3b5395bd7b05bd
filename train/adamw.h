#pragma once
// The AdamW parameter update (decoupled weight decay), in place, no autograd:
//   m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   p −= lr · ( m̂ / (√v̂ + ε) + wd · p ),  m̂ = m / (1 − β1^t), v̂ = v / (1 − β2^t)
#include <cmath>
#include <cstdint>

#include "math/clipping.h"
#include "tensor/tensor.h"

namespace cast::train {

struct AdamWStep {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.98, eps = 1e-9, weight_decay = 0.0;
  int64_t t = 1;  // 1-based step count, for the bias corrections
};

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s);

// The same on squared_norm (1), computed in double where the tensor lives -> (1) of its dtype.
// On a GPU the norm never goes to the host.
Tensor clip_factor(const Tensor& squared_norm, double max_norm);

}  // namespace cast::train
