#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       int64_t rows, int64_t d, double eps);
void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t d);
}  // namespace cast::cuda
