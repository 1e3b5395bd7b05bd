#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// Improved clustered attention's first term without the per-query copies of K_T and V_T (which
// take B·H·N·k·d floats each): query i of cluster j attends to the keys of its cluster's top-key
// list only. q, k, v: (BH, N, d) f32, d <= kTopKeyMaxHead; top: (BH, C·k) i32 (−1 = empty slot);
// assign: (BH, N) i32 (−1 = no cluster).
//   forward:  top_out (BH, N, d) = softmax(q_i K_Tᵀ · scale over filled slots) V_T, lse (BH, N)
//             its log-sum-exp (−inf, and a zero row, for a query with no cluster or no key);
//   backward: given d_top (BH, N, d), dq += ..., dk += ..., dv += ... (each may be null), with the
//             probabilities recomputed from lse.
constexpr int64_t kTopKeyMaxHead = 128;
bool topkey_attention_fits(int64_t top, int64_t d);  // the backward's shared accumulators fit
void topkey_attention_forward(Tensor& top_out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& top, const Tensor& assign, int64_t clusters, int64_t k_top, double scale);
void topkey_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& d_top, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& top, const Tensor& assign,
                               const Tensor& top_out, const Tensor& lse, int64_t clusters, int64_t k_top, double scale);
}  // namespace cast::cuda
