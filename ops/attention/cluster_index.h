#pragma once
// The index bookkeeping of the clustered mechanisms: masks and positions computed from cluster
// ids, constants of the backward pass (no gradient). Each runs where its ids are (the CUDA
// versions are in cuda/attention/cluster_index.cu and cuda/attention/clustering.cu), so the step ops of
// the step ops of ops/attention/ read the same on both devices and copy nothing to the host and back.
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::ops {

// 1 where a slot holds a token, 0 where it is empty (−1): members (…) -> `shape` (same count) as `like`.
Tensor slot_mask(const Tensor& members, const Shape& shape, const Tensor& like);

// Position of W[i, c] in W viewed as (B·H, N·C) for each slot, −1 for an empty slot:
// members (B, H, C, κ) -> (B·H, C·κ) i32.
Tensor member_weight_index(const Tensor& members, int64_t clusters, int64_t kappa);

// 1/|j| of each cluster (0 for an empty one): assignment (G, N) i32 -> (G, C) as `like`.
Tensor inverse_cluster_counts(const Tensor& assignment, int64_t clusters, const Tensor& like);

// Improved clustered attention: outside (B, H, C, N) = 1[key l is not among cluster j's top keys];
// with `slots`, also (B·H·N, top) = 1 where slot s of query i's cluster's top keys holds a key.
// top_keys (B, H, C, top) i32, assignment (B·H, N) i32; both as a_c (B, H, C, N).
void top_key_masks(Tensor* slots, Tensor& outside, const Tensor& top_keys, const Tensor& assignment, const Tensor& a_c);

}  // namespace cast::ops
