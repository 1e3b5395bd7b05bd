#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// dst = src (add: dst += src), converted between f32 and bf16 (ops/convert.h); the sum of `add`
// is taken in f32 and rounded to dst's dtype.
void convert(Tensor& dst, const Tensor& src, bool add);
}  // namespace cast::cuda
