#include "ops/attention.h"

#include <cmath>
#include <vector>

#include "ops/clustering.h"
#include "ops/ops.h"

namespace cast::ops {

// ---------------------------------------------------------------- helpers
Tensor constant_like(const std::vector<double>& values, const Shape& shape, const Tensor& like) {
  return Tensor::from_vector<double>(values, shape).to(like.dtype()).to(like.device());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return add(x, Tensor::zeros(shape, x.dtype(), x.device()));
}

Tensor take_along_last(const Tensor& x, const Tensor& idx) {
  check_ndim("take_along_last", x, 2, "x");
  check_ndim("take_along_last", idx, 2, "idx");
  Tensor rows = gather_rows(reshape(x, {x.dim(0), x.dim(1), 1}), idx);  // (R, M, 1)
  return reshape(rows, {idx.dim(0), idx.dim(1)});
}

// Host copy of an integer tensor as int64 values.
static std::vector<int64_t> host_ints(const Tensor& t) {
  auto v = t.to_double_vector();
  return std::vector<int64_t>(v.begin(), v.end());
}

static Tensor ints_like(const std::vector<int64_t>& v, const Shape& shape, const Tensor& like_device) {
  std::vector<int32_t> w(v.begin(), v.end());
  return Tensor::from_vector<int32_t>(w, shape, like_device.device());
}

// ---------------------------------------------------------------- full attention
Tensor full_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  check_ndim("full_attention", q, 4, "q");
  const double factor = 1.0 / std::sqrt(static_cast<double>(q.dim(3)));
  Tensor scores = scale(matmul(q, k, false, true), factor);  // (B, H, N, N)
  return matmul(softmax(scores, mask), v);
}

// ---------------------------------------------------------------- CAST
Tensor surrogate_scores(const Tensor& q, const Tensor& s, double factor) {
  check_ndim("surrogate_scores", q, 4, "q");
  check_ndim("surrogate_scores", s, 3, "surrogates");
  CAST_CHECK(s.dim(0) == q.dim(1) && s.dim(2) == q.dim(3), "surrogate_scores: surrogates {} do not fit q {}",
             s.describe(), q.describe());
  Tensor s_b = expand(reshape(s, {1, s.dim(0), s.dim(1), s.dim(2)}), {q.dim(0), s.dim(0), s.dim(1), s.dim(2)});
  return scale(matmul(q, s_b, false, true), factor);
}

Tensor cluster_probabilities(const Tensor& scores, AttentionFn f) {
  if (f == AttentionFn::softmax) return softmax(scores);
  Tensor u = laplace(scores);
  // Rows whose every score lies far below μ underflow to 0; the floor keeps them finite (zeros).
  Tensor total = affine(sum(u, -1, true), 1.0, 1e-30);
  return div(u, total);
}

Tensor gated_affinity(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                      const Tensor& a_k) {
  check_ndim("gated_affinity", x, 3, "x");
  check_ndim("gated_affinity", a_q, 4, "a_q");
  const int64_t G = a_q.dim(1);
  CAST_CHECK(gate_w.shape() == (Shape{x.dim(2), G}) && gate_b.shape() == Shape{G},
             "gated_affinity: gate_w {} and gate_b {} must be [{}, {}] and [{}]", gate_w.describe(),
             gate_b.describe(), x.dim(2), G, G);
  Tensor g = sigmoid(add(matmul(x, gate_w), gate_b));                          // (B, N, G)
  Tensor g4 = reshape(permute(g, {0, 2, 1}), {x.dim(0), G, x.dim(1), 1});      // (B, G, N, 1)
  return add(a_k, mul(g4, sub(a_q, a_k)));
}

Tensor intra_cluster_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  check_ndim("intra_cluster_attention", members, 4, "members");
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  const int64_t C = members.dim(2), kappa = members.dim(3);
  CAST_CHECK(members.dim(0) == B && members.dim(1) == H, "intra_cluster_attention: members {} do not fit q {}",
             members.describe(), q.describe());
  Tensor idx = members.view({B * H, C * kappa});
  auto gather = [&](const Tensor& t) {
    return reshape(gather_rows(reshape(t, {B * H, N, d}), idx), {B * H * C, kappa, d});
  };
  std::vector<double> slot(B * H * C * kappa);
  auto ids = host_ints(members);
  for (size_t i = 0; i < slot.size(); ++i) slot[i] = ids[i] >= 0 ? 1.0 : 0.0;
  Tensor slot_mask = constant_like(slot, {B * H * C, kappa}, q);
  Tensor qc = gather(q), kc = gather(k), vc = gather(v);
  Tensor scores = scale(matmul(qc, kc, false, true), 1.0 / std::sqrt(static_cast<double>(d)));
  Tensor out = matmul(softmax(scores, slot_mask), vc);  // (B·H·C, κ, d)
  return reshape(out, {B, H, C, kappa, d});
}

Tensor cluster_summaries(const Tensor& a_k, const Tensor& v, const Tensor& mask) {
  const int64_t B = a_k.dim(0), N = a_k.dim(2);
  Tensor weighted = a_k;
  if (mask.defined()) weighted = mul(a_k, reshape(mask, {B, 1, N, 1}));
  Tensor column_total = affine(sum(weighted, 2, true), 1.0, 1e-30);  // (B, H, 1, C)
  Tensor p = div(weighted, column_total);                              // columns sum to 1
  return matmul(p, v, true, false);                                    // (B, H, C, d)
}

Tensor combine_clusters(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members) {
  const int64_t B = w.dim(0), H = w.dim(1), N = w.dim(2), C = w.dim(3);
  const int64_t kappa = members.dim(3), d = r_intra.dim(4);
  // W[i, c] for every slot (c, p) holding token i: a gather from W viewed as (B·H, N·C).
  auto ids = host_ints(members);
  std::vector<int64_t> flat(ids.size());
  for (size_t e = 0; e < ids.size(); ++e) {
    const int64_t c = (e / kappa) % C;
    flat[e] = ids[e] >= 0 ? ids[e] * C + c : -1;
  }
  Tensor w_slot = take_along_last(reshape(w, {B * H, N * C}), ints_like(flat, {B * H, C * kappa}, w));
  Tensor w_slot4 = reshape(w_slot, {B * H, C, kappa, 1});
  Tensor intra = reshape(r_intra, {B * H, C, kappa, d});
  Tensor slot_values = intra;
  if (r_inter.defined()) slot_values = sub(intra, reshape(r_inter, {B * H, C, 1, d}));  // correction terms
  Tensor contributions = reshape(mul(w_slot4, slot_values), {B * H, C * kappa, d});
  Tensor sparse = reshape(scatter_add_rows(contributions, members.view({B * H, C * kappa}), N), {B, H, N, d});
  if (!r_inter.defined()) return sparse;
  return add(matmul(w, r_inter), sparse);
}

// ---------------------------------------------------------------- clustered
Tensor cluster_centroids(const Tensor& q, const Tensor& assignment, int64_t clusters) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  Tensor assign = assignment.view({B * H, N});
  Tensor sums = scatter_add_rows(reshape(q, {B * H, N, d}), assign, clusters);  // (B·H, C, d)
  Tensor counts = cluster_counts(assign, clusters, q.dtype());
  auto c = counts.to_double_vector();
  for (double& x : c) x = x > 0 ? 1.0 / x : 0.0;  // an empty cluster's centroid is 0
  Tensor inv = constant_like(c, {B * H, clusters, 1}, q);
  return reshape(mul(sums, inv), {B, H, clusters, d});
}

Tensor centroid_attention(const Tensor& centroids, const Tensor& k, const Tensor& mask) {
  const double factor = 1.0 / std::sqrt(static_cast<double>(k.dim(3)));
  return softmax(scale(matmul(centroids, k, false, true), factor), mask);
}

Tensor broadcast_to_members(const Tensor& per_cluster, const Tensor& assignment) {
  const int64_t B = per_cluster.dim(0), H = per_cluster.dim(1), C = per_cluster.dim(2), w = per_cluster.dim(3);
  const int64_t N = assignment.dim(2);
  Tensor out = gather_rows(reshape(per_cluster, {B * H, C, w}), assignment.view({B * H, N}));
  return reshape(out, {B, H, N, w});
}

Tensor improved_clustered_output(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                 const Tensor& top_keys, const Tensor& assignment) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  const int64_t C = a_c.dim(2), topk = top_keys.dim(3);
  Tensor keys_idx = top_keys.view({B * H, C * topk});
  // m̂_j = Σ_{l ∈ T_j} A^c_jl (a differentiable function of Q̄ and K)
  Tensor a_top = take_along_last(reshape(a_c, {B * H * C, N}), top_keys.view({B * H * C, topk}));
  Tensor m_hat = sum(reshape(a_top, {B, H, C, topk}), 3, true);  // (B, H, C, 1)
  // K_T and V_T of each cluster, then handed to each member query: (B·H·N, k, d)
  auto per_query = [&](const Tensor& t) {
    Tensor cluster_rows = reshape(gather_rows(reshape(t, {B * H, N, d}), keys_idx), {B, H, C, topk * d});
    return reshape(broadcast_to_members(cluster_rows, assignment), {B * H * N, topk, d});
  };
  // slot mask: query i may use slot s of its cluster's T when that slot holds a key
  auto t_ids = host_ints(top_keys), a_ids = host_ints(assignment);
  std::vector<double> slot(B * H * N * topk, 0.0);
  for (int64_t g = 0; g < B * H; ++g)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t j = a_ids[g * N + i];
      if (j < 0) continue;
      for (int64_t s = 0; s < topk; ++s) slot[(g * N + i) * topk + s] = t_ids[(g * C + j) * topk + s] >= 0 ? 1 : 0;
    }
  Tensor slot_mask = constant_like(slot, {B * H * N, topk}, q);
  Tensor q_rows = reshape(q, {B * H * N, 1, d});
  Tensor scores = scale(matmul(q_rows, per_query(k), false, true), 1.0 / std::sqrt(static_cast<double>(d)));
  Tensor top_out = reshape(matmul(softmax(scores, slot_mask), per_query(v)), {B, H, N, d});
  Tensor first = mul(broadcast_to_members(m_hat, assignment), top_out);
  // the keys outside T keep their centroid attention weight
  std::vector<double> outside(B * H * C * N, 1.0);
  for (int64_t r = 0; r < B * H * C; ++r)
    for (int64_t s = 0; s < topk; ++s)
      if (t_ids[r * topk + s] >= 0) outside[r * N + t_ids[r * topk + s]] = 0.0;
  Tensor a_rest = mul(a_c, constant_like(outside, {B, H, C, N}, a_c));
  Tensor second = broadcast_to_members(matmul(a_rest, v), assignment);
  return add(first, second);
}

}  // namespace cast::ops
