#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1, double beta2,
                  double eps, double weight_decay, double correction1, double correction2);
// factor (1) = max_norm / sqrt(squared_norm) when that norm exceeds max_norm > 0, else 1 (train/adamw.h).
void clip_factor(Tensor& factor, const Tensor& squared_norm, double max_norm);
}  // namespace cast::cuda
