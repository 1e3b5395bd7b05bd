#pragma once
// The elementwise passes of ops::mlp (f32), each one kernel where the reference runs two.
#include "tensor/tensor.h"

namespace cast::cuda {
// z (R, H) += b (H) in place, and a = GELU(z): the bias add and the activation in one pass; a
// is FP32, or BF16 (each element rounded as an operand copy rounds it).
void bias_gelu(Tensor& z, Tensor& a, const Tensor& b);
// a = GELU(z) rounded to a BF16 a.
void gelu_bf16(Tensor& a, const Tensor& z);
// dz = da · GELU'(z), written (the reference adds it into zeros: one pass fewer); dz may be da.
void gelu_backward(Tensor& dz, const Tensor& da, const Tensor& z);
}  // namespace cast::cuda
