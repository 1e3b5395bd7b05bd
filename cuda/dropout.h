#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::cuda {
void dropout(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset, bool accumulate);
}  // namespace cast::cuda
