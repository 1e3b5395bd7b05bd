#pragma once
// Layer normalisation over the last axis: y = (x − mean) · rstd · gamma + beta.
#include "tensor/tensor.h"

namespace cast::ops {

// x: (..., D); gamma, beta: (D); mean, rstd: (rows) saved for backward.
void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       double eps);
// dx, dgamma, dbeta (each may be null) += their gradients.
void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd);

Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);

}  // namespace cast::ops
