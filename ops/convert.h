#pragma once
// Conversion between float dtypes, recorded on the tape: f32 ↔ bf16 on either device, and f64 ↔
// bf16, f32 ↔ f64 on the CPU. To bf16 rounds to the nearest value, ties to even, infinities and
// NaN kept (tensor/bf16.h); from bf16 is exact. The backward passes the gradient through,
// converted to the input's dtype: rounding's derivative is taken as 1, as torch's `.to()` does.
#include "tensor/tensor.h"

namespace cast::ops {

// out (any float dtype, x's shape) = x converted.
void convert_forward(Tensor& out, const Tensor& x);
// dx += dout, the sum taken in dx's dtype (for bf16: in f32, then rounded).
void convert_backward(Tensor& dx, const Tensor& dout);

Tensor convert(const Tensor& x, DType dtype);

}  // namespace cast::ops
