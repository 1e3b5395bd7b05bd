#pragma once
// Fused CPU kernels of the clustering mechanisms, beside their step-by-step reference ops in
// ops/attention.h, which they must equal (values and every gradient).
//
// CAST step 5, intra-cluster attention: for each cluster its κ member rows of Q, K and V are
// gathered into a tile that stays in cache, the κ × κ scores and their softmax live only
// there, and the backward recomputes them from the saved row log-sum-exp. The reference
// stores the gathered rows and the B·H·C·κ² probabilities.
//
// Improved clustered attention (§4), the top-k recomputation: per cluster j the rows K_T and
// V_T of its top keys are gathered once and every member query attends to them in place;
// the reference copies K_T and V_T once per query (B·H·N·k·d values each).
#include "tensor/tensor.h"

namespace cast::ops {

// q, k, v: (B, H, N, d); members: (B, H, C, κ) int, −1 = empty slot -> (B, H, C, κ, d).
// Same values as intra_cluster_attention (an empty slot's row included).
Tensor intra_cluster_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);

// Same arguments and result as improved_clustered_output (ops/attention.h).
Tensor improved_clustered_output_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                       const Tensor& top_keys, const Tensor& assignment);

}  // namespace cast::ops
