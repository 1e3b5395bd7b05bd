#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::cuda {
// y = (accumulate ? y : residual, or 0 where undefined) + x ⊙ keep / (1 − p)
void dropout(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset, bool accumulate,
             const Tensor& residual = Tensor());
}  // namespace cast::cuda
