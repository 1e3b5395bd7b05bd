#pragma once
// A Transformer block's MLP, y = GELU(x W1 + b1) W2 + b2, as one op. Its reference is its three
// ops, linear, gelu and linear (what --reference runs, nn/layers.cpp), which keep the hidden
// layer twice for the backward: before GELU (z, for GELU's derivative) and after it (a, for
// W2's gradient). This op keeps z alone and forms a = GELU(z) again in its backward, with the
// same kernel on the same values, so its gradients are the reference's bit for bit and a model
// holds one (..., hidden) tensor per block where the reference holds two.
#include "tensor/tensor.h"

namespace cast::ops {

// z: (R, hidden) = x (R, D) · w1 + b1, kept; y: (R, D_out) = GELU(z) · w2 + b2. x's leading dims
// are folded into the rows R.
void mlp_forward(Tensor& y, Tensor& z, const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                 const Tensor& b2);
// The gradients of x and the four parameters from dy, each written (beta 0) or added (beta 1)
// and skipped where its pointer is null; betas in the order dx, dw1, db1, dw2, db2.
struct MlpGrads {
  Tensor *dx = nullptr, *dw1 = nullptr, *db1 = nullptr, *dw2 = nullptr, *db2 = nullptr;
  double beta[5] = {0, 0, 0, 0, 0};
};
void mlp_backward(const MlpGrads& grads, const Tensor& dy, const Tensor& x, const Tensor& z, const Tensor& w1,
                  const Tensor& w2);

// x: (..., D), w1: (D, hidden), b1: (hidden), w2: (hidden, D_out), b2: (D_out) -> (..., D_out)
Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2);

}  // namespace cast::ops
