#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1, double beta2,
                  double eps, double weight_decay, double correction1, double correction2);
}  // namespace cast::cuda
