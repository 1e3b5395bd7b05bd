#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void masked_mean_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t B, int64_t N, int64_t D);
void masked_mean_backward(Tensor& dx, const Tensor& dy, const Tensor& mask, int64_t B, int64_t N, int64_t D);
}  // namespace cast::cuda
