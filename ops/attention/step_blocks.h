#pragma once
// The raw building blocks of the step ops (ops/attention/<step>.cpp). Inside a step's forward
// and backward only the primitive pair functions run (nothing is recorded), so each step is
// exactly one node on the tape with its own backward.
#include "ops/ops.h"
#include "tensor/tensor.h"

namespace cast::ops::step_blocks {

inline Tensor like(const Shape& shape, const Tensor& t) { return Tensor::empty(shape, t.dtype(), t.device()); }
inline Tensor zeros(const Shape& shape, const Tensor& t) { return Tensor::zeros(shape, t.dtype(), t.device()); }

// a op b with broadcasting, not recorded
inline Tensor raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = like(broadcast_shapes("attention", a.shape(), b.shape()), a);
  binary_forward(out, op, a, b);
  return out;
}

// c = alpha · op(a) op(b) + beta · c over matching leading batch dims
inline void bmm(Tensor c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha, double beta) {
  gemm(c, a, b, ta, tb, alpha, beta, matmul_shape(a, b, ta, tb));
}

// The gradient buffer of t viewed with another shape (writes land in t's gradient).
inline Tensor grad_view(Tensor& t, const Shape& shape) { return t.grad_accumulator().view(shape); }

}  // namespace cast::ops::step_blocks
