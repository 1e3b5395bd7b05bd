#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// CAST Top-K clustering on the device (ops/clustering.h): affinity (G, N, C) f32, mask (B, N)
// or undefined, out (G, C, kappa) i32. The same members as the CPU op, bit for bit.
void cluster_topk(Tensor& out, const Tensor& affinity, const Tensor& mask, int64_t kappa);
// mask (same element count as members) = 1 where a slot holds a token, 0 where it is empty (−1).
void slot_mask(Tensor& mask, const Tensor& members);
}  // namespace cast::cuda
