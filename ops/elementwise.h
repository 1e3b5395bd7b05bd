#pragma once
// Broadcasting add, sub, mul, div (numpy rules), scalar affine maps, and the in-place helpers
// that backward passes use to accumulate gradients.
#include "math/binary_math.h"
#include "tensor/broadcast.h"
#include "tensor/tensor.h"

namespace cast::ops {

// out = a op b with broadcasting. out: broadcast shape of a and b.
void binary_forward(Tensor& out, BinaryOp op, const Tensor& a, const Tensor& b);
// da += reduce(dout * d(op)/da), db likewise; either may be undefined (not wanted).
void binary_backward(Tensor* da, Tensor* db, BinaryOp op, const Tensor& dout, const Tensor& a, const Tensor& b);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// y = alpha * x + beta (scaling by 1/sqrt(d), 1 - g, ...).
void affine_forward(Tensor& y, const Tensor& x, double alpha, double beta);
void affine_backward(Tensor& dx, const Tensor& dy, double alpha);
Tensor affine(const Tensor& x, double alpha, double beta = 0.0);
inline Tensor scale(const Tensor& x, double alpha) { return affine(x, alpha, 0.0); }

// acc += alpha * g, same shape (no autograd).
void add_into(Tensor acc, const Tensor& g, double alpha = 1.0);  // acc: a handle, written through
// Sums g over the dimensions that were broadcast to reach g's shape from `target`.
Tensor sum_to_shape(const Tensor& g, const Shape& target);

}  // namespace cast::ops
