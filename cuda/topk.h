#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void topk(Tensor& idx, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group, int64_t k);
}  // namespace cast::cuda
