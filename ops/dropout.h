#pragma once
// Inverted dropout driven by the counter-based RNG: element i is kept when
// uniform(seed, offset + i) >= p, and scaled by 1/(1 − p). Backward regenerates the same
// mask from (seed, offset) instead of storing it.
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::ops {

void dropout_forward(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset);
void dropout_backward(Tensor& dx, const Tensor& dy, double p, uint64_t seed, uint64_t offset);

// Identity when p == 0 (or in evaluation, where the caller passes p = 0).
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);

}  // namespace cast::ops
