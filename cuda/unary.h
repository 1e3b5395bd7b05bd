#pragma once
#include "math/unary_math.h"
#include "tensor/tensor.h"

namespace cast::cuda {
void unary_forward(Tensor& y, UnaryOp op, const Tensor& x);
void unary_backward(Tensor& dx, UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y);
}  // namespace cast::cuda
