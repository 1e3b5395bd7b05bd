#pragma once
// Indices of the k largest entries along the last axis (integer output, no gradient).
#include "tensor/tensor.h"

namespace cast::ops {

// x: (..., N) float; mask (optional, grouped like softmax's): masked entries are never chosen.
// -> (..., k) i32, ordered by descending value, ties toward the lower index; slots that
// cannot be filled (fewer than k eligible entries) hold −1.
void topk_forward(Tensor& idx, const Tensor& x, int64_t k, const Tensor& mask);
Tensor topk(const Tensor& x, int64_t k, const Tensor& mask = Tensor());

}  // namespace cast::ops
