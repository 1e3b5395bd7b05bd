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

// A residual's dropout as one op: y = x + dropout(t), the same values and gradients as
// add(x, dropout(t, p, seed, offset)), its reference, bit for bit. The fast twin of those two
// ops: one pass forward instead of two (dropout(t) is never written), and in the backward x
// takes y's gradient buffer itself while t's gradient is written, not zero-filled and added
// into; nothing is saved but x and t's places on the tape (the two ops kept dropout(t) too).
// x and t of one shape.
void dropout_add_forward(Tensor& y, const Tensor& x, const Tensor& t, double p, uint64_t seed, uint64_t offset);
Tensor dropout_add(const Tensor& x, const Tensor& t, double p, uint64_t seed, uint64_t offset);

}  // namespace cast::ops
