#pragma once
// Mean over the real tokens of each sequence (padding excluded).
#include "tensor/tensor.h"

namespace cast::ops {

// x: (B, N, D), mask: (B, N) of 1 (real) / 0 (padding) -> y: (B, D).
// A sequence with no real token pools to zeros.
void masked_mean_forward(Tensor& y, const Tensor& x, const Tensor& mask);
void masked_mean_backward(Tensor& dx, const Tensor& dy, const Tensor& mask);

Tensor masked_mean(const Tensor& x, const Tensor& mask);

}  // namespace cast::ops
