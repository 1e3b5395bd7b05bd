#pragma once
// A linear layer's y = x W + b as one op. The reference is its two ops, matmul then add (what
// --reference runs, nn/layers.cpp); this node keeps what they keep between them, minus the
// product before the bias: the bias is added in the product's own buffer, so the model holds one
// (..., N) tensor where matmul + add hold two, and the add's pass over it is gone.
#include "tensor/tensor.h"

namespace cast::ops {

// y: (R, N) = x (R, K) · w (K, N) + b (N), x's leading dims folded into the rows R.
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b);
// y: (R, N) = x (R, K) · w (K, N), the product alone (the bias is the caller's)
void linear_product(Tensor& y, const Tensor& x, const Tensor& w);
// dx = dy wᵀ, dw = xᵀ dy, db = the column sums of dy; each written (beta 0) or added (beta 1),
// and skipped where its pointer is null.
void linear_backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                     double beta_x, double beta_w, double beta_b);

// x: (..., K), w: (K, N), b: (N) -> (..., N)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace cast::ops
