#pragma once
#include "math/binary_math.h"
#include "tensor/broadcast.h"
#include "tensor/tensor.h"

namespace cast::cuda {
void binary_forward(Tensor& out, BinaryOp op, const Tensor& a, const Tensor& b, const BroadcastIndex& idx);
void binary_backward(Tensor* ga, Tensor* gb, BinaryOp op, const Tensor& dout, const Tensor& a, const Tensor& b,
                     const BroadcastIndex& idx);
// y = alpha x + beta, or y += alpha x + beta with accumulate
void affine(Tensor& y, const Tensor& x, double alpha, double beta, bool accumulate);
}  // namespace cast::cuda
