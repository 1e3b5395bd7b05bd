#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// Full attention without an M×N matrix (ops/flash_attention.h): q (B, H, M, d), k and v
// (B, H, N, d), mask (B, N) f32 or undefined; d at most 128.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask);
// Adds into each given gradient (dq, dk, dv may be null).
void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                              const Tensor& lse);
}  // namespace cast::cuda
