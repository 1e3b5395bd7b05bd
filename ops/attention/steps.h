#pragma once
// The steps of every attention mechanism of ATTENTION.md, one op per numbered step.
// Each step records one node whose backward is written out next to its forward
// (ops/attention/<step>.cpp, one file per step). Both are built from the primitive kernels' forward/backward pair
// functions (gemm, softmax, row gather/scatter, broadcasting arithmetic), so every step runs
// on both devices. The gate's linear layer and sigmoid are recorded primitive ops.
//
// Shapes: B batch, H heads, N tokens, d head width, C clusters, κ cluster size.
// Per-head tensors are (B, H, N, d). mask: (B, N) float, 1 = real token, 0 = padding.
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::ops {

// ---------------------------------------------------------------- full attention (§1)
// P = softmax(Q Kᵀ/√d + key mask): q (B, H, M, d), k (B, H, N, d) -> (B, H, M, N).
// One op: forward and backward written out in ops/attention/full_attention.cpp.
Tensor attention_probabilities(const Tensor& q, const Tensor& k, const Tensor& mask);
// P V -> (B, H, N, d)
Tensor full_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

// ---------------------------------------------------------------- CAST (§2)
// 1. q: (B, G, N, w), s: (G, C, w) -> Q Sᵀ·scale: (B, G, N, C). G = H (per-head) or 1 (shared).
Tensor surrogate_scores(const Tensor& q, const Tensor& s, double scale);

enum class AttentionFn { softmax, laplace };
// 2. rows of A over the C clusters, summing to 1 (laplace: elementwise, then divided by the row sum).
Tensor cluster_probabilities(const Tensor& scores, AttentionFn f);

// 1–2 together, the step with a fast path (ops/attention/fast_paths.h): A = f-rows of (X Sᵀ/√w) for x (B, G, N, w)
// and s (G, C, w) -> (B, G, N, C), the queries' or the keys' affinities to the surrogates.
Tensor cluster_affinities(const Tensor& x, const Tensor& s, AttentionFn f);

// 3. g = sigmoid(x W_φ + b_φ): (B, N, G) -> A_g = A_k + g ⊙ (A_q − A_k): (B, G, N, C).
Tensor gated_affinity(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                      const Tensor& a_k);
// Its two halves: the gate g = sigmoid(x W_φ + b_φ): x (B, N, D), gate_w (D, G), gate_b (G) ->
// (B, N, G), and the mix A_g = A_k + g ⊙ (A_q − A_k) given g.
Tensor cast_gate(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b);
Tensor mix_affinities(const Tensor& g, const Tensor& a_q, const Tensor& a_k);

// 5. members: (B, H, C, κ) int, −1 = empty slot -> R_intra: (B, H, C, κ, d)
Tensor intra_cluster_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);

// 6. P = A_k normalised over the real tokens of each cluster; R_inter = Pᵀ V: (B, H, C, d).
Tensor cluster_summaries(const Tensor& a_k, const Tensor& v, const Tensor& mask);

// 7. O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c]) : (B, H, N, d).
// With r_inter undefined (summaries off) only the intra-cluster terms remain.
Tensor combine_clusters(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members);

// Steps 1–3 and 5–7 together, given the gate and the clusters that step 4 chose from A_g (a
// constant of the backward): per-head clustering, g (B, N, H) = cast_gate(x, W_φ, b_φ),
// q, k, v (B, H, N, d), s (H, C, d), mask (B, N) or undefined, members (B, H, C, κ) ->
// O (B, H, N, d). The mixing weights W are A_g, or A_q with `mix_query` (g then gets no
// gradient); `summaries` off drops R_inter. The chain of the step ops above, and the reference
// of the one fused op (ops/attention/cast_attention_fused.cpp). The gate is an input, not a step of it, so
// that a layer can record the gate before its projections: x's gradient is then first formed
// where the projections' backward forms it anyway.
Tensor cast_attention(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                      const Tensor& mask, const Tensor& members, AttentionFn f, bool summaries, bool mix_query);

// ---------------------------------------------------------------- clustered (§3, §4)
// 3. Q̄_j = mean of member queries: assignment (B, H, N) int -> (B, H, C, d)
Tensor cluster_centroids(const Tensor& q, const Tensor& assignment, int64_t clusters);
// 4. A^c = softmax(Q̄ Kᵀ/√d + key mask): (B, H, C, N)
Tensor centroid_attention(const Tensor& centroids, const Tensor& k, const Tensor& mask);
// 5. every query outputs its cluster's row of `per_cluster` (B, H, C, w) -> (B, H, N, w), 0 for padding
Tensor broadcast_to_members(const Tensor& per_cluster, const Tensor& assignment);
// §4: improved clustered output from A^c, the top keys T (B, H, C, k) of each cluster and the
// assignment: O_i = m̂_j softmax(Q_i K_Tᵀ/√d) V_T + Σ_{l ∉ T} A^c_jl V_l.
Tensor improved_clustered_output(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                 const Tensor& top_keys, const Tensor& assignment);

// ---------------------------------------------------------------- helpers
// Broadcasts x to `shape` (numpy rules); the gradient sums back.
Tensor expand(const Tensor& x, const Shape& shape);
// A constant tensor of x's dtype and device from host values.
Tensor constant_like(const std::vector<double>& values, const Shape& shape, const Tensor& like);

}  // namespace cast::ops
