#pragma once
// Elementwise functions: exp, log, sqrt, relu, gelu (exact, erf-based), sigmoid, and the
// erf-based Laplace attention function of CAST.
#include "math/unary_math.h"
#include "tensor/tensor.h"

namespace cast::ops {

void unary_forward(Tensor& y, UnaryOp op, const Tensor& x);
// dx += dy * f'(x)
void unary_backward(Tensor& dx, UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y);

Tensor unary(UnaryOp op, const Tensor& x);
inline Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
inline Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
inline Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
inline Tensor relu(const Tensor& x) { return unary(UnaryOp::relu, x); }
inline Tensor gelu(const Tensor& x) { return unary(UnaryOp::gelu, x); }
inline Tensor sigmoid(const Tensor& x) { return unary(UnaryOp::sigmoid, x); }
inline Tensor laplace(const Tensor& x) { return unary(UnaryOp::laplace, x); }

}  // namespace cast::ops
