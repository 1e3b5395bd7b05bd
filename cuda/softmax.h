#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void softmax_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group,
                     bool log);
void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& mask, int64_t rows, int64_t len,
                      int64_t group, bool log);
}  // namespace cast::cuda
