#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void sum_axis_forward(Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double scale);
void sum_axis_backward(Tensor& dx, const Tensor& dy, int64_t outer, int64_t n, int64_t inner, double scale);
}  // namespace cast::cuda
