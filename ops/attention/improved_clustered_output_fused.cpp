#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/fused_rows.h"
#include "ops/matmul.h"
#include "ops/rows.h"

// Improved clustered attention (§4) fused on the CPU, the top-k recomputation: per cluster j the
// rows K_T and V_T of its top keys are gathered once and every member query attends to them in
// place; the reference copies K_T and V_T once per query (B·H·N·k·d values each).
namespace cast::ops {

namespace {
using namespace fused_rows;

// ---------------------------------------------------------------- improved clustered output
struct ImprovedShape {
  int64_t BH, N, C, top, d;
};

// The queries of each cluster of one head, grouped: order[offset[j] .. offset[j+1]).
struct Members {
  std::vector<int32_t> order;
  std::vector<int64_t> offset;
};

Members group_by_cluster(const int32_t* assign, int64_t N, int64_t C) {
  Members m;
  m.offset.assign(C + 2, 0);
  for (int64_t i = 0; i < N; ++i)
    if (assign[i] >= 0) ++m.offset[assign[i] + 2];
  for (int64_t j = 0; j < C; ++j) m.offset[j + 2] += m.offset[j + 1];
  m.order.resize(m.offset[C + 1]);
  for (int64_t i = 0; i < N; ++i)
    if (assign[i] >= 0) m.order[m.offset[assign[i] + 1]++] = static_cast<int32_t>(i);
  m.offset.pop_back();  // offset[j] now starts cluster j; offset[C] ends the last
  return m;
}

template <class T>
struct ImprovedData {
  const T *q, *k, *v, *a_c;     // (BH, N, d) ×3, (BH, C, N)
  const int32_t *top, *assign;  // (BH, C, top), (BH, N)
};

// For one head: m̂_j, rest_j = (A^c_j ⊙ 1[l ∉ T_j]) V and each query's top-key output y_i.
template <class T>
void improved_forward_head(const ImprovedShape& s, const ImprovedData<T>& x, int64_t bh, T* out, T* top_out, T* m_hat,
                           T* lse, std::vector<T>& buf) {
  const int64_t N = s.N, C = s.C, K = s.top, d = s.d;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T *q = x.q + bh * N * d, *k = x.k + bh * N * d, *v = x.v + bh * N * d, *a = x.a_c + bh * C * N;
  const int32_t *top = x.top + bh * C * K, *assign = x.assign + bh * N;
  Members m = group_by_cluster(assign, N, C);
  buf.resize(C * d + 2 * K * d + 2 * N * d + N * K + N);
  T *rest = buf.data(), *kt = rest + C * d, *vt = kt + K * d, *qm = vt + K * d, *ym = qm + N * d, *p = ym + N * d;
  T* lse_rows = p + N * K;
  gemm_tile<T>(rest, a, v, false, false, T(1), T(0), C, d, N);  // A^c V, then the top keys taken out
  for (int64_t j = 0; j < C; ++j) {
    const int32_t* tj = top + j * K;
    T mh = 0;
    for (int64_t t = 0; t < K; ++t) {
      if (tj[t] < 0) continue;
      const T w = a[j * N + tj[t]];
      mh += w;
      for (int64_t e = 0; e < d; ++e) rest[j * d + e] -= w * v[tj[t] * d + e];
    }
    m_hat[bh * C + j] = mh;
    const int64_t n = m.offset[j + 1] - m.offset[j];
    if (n == 0) continue;
    const int32_t* who = m.order.data() + m.offset[j];
    gather(kt, k, tj, K, d);
    gather(vt, v, tj, K, d);
    gather(qm, q, who, n, d);
    gemm_tile<T>(p, qm, kt, false, true, scale, T(0), n, K, d);  // S = Q_j K_Tᵀ/√d
    softmax_rows(p, tj, n, K, lse_rows);
    gemm_tile<T>(ym, p, vt, false, false, T(1), T(0), n, d, K);  // y = P V_T
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i = who[r];
      lse[bh * N + i] = lse_rows[r];
      for (int64_t e = 0; e < d; ++e) {
        top_out[(bh * N + i) * d + e] = ym[r * d + e];
        out[(bh * N + i) * d + e] = mh * ym[r * d + e] + rest[j * d + e];
      }
    }
  }
  for (int64_t i = 0; i < N; ++i)  // unassigned (padded) queries output zeros
    if (assign[i] < 0) {
      std::fill(out + (bh * N + i) * d, out + (bh * N + i + 1) * d, T(0));
      std::fill(top_out + (bh * N + i) * d, top_out + (bh * N + i + 1) * d, T(0));
      lse[bh * N + i] = softmax_rule::masked<T>();
    }
}

template <class T>
struct ImprovedGrads {
  T *dq, *dk, *dv, *da_c;  // null when not wanted
  const T* dout;           // (BH, N, d)
  const T *top_out, *m_hat, *lse;
};

template <class T>
void improved_backward_head(const ImprovedShape& s, const ImprovedData<T>& x, const ImprovedGrads<T>& g, int64_t bh,
                            std::vector<T>& buf) {
  const int64_t N = s.N, C = s.C, K = s.top, d = s.d;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const T *q = x.q + bh * N * d, *k = x.k + bh * N * d, *v = x.v + bh * N * d, *a = x.a_c + bh * C * N;
  const int32_t *top = x.top + bh * C * K, *assign = x.assign + bh * N;
  const T* dout = g.dout + bh * N * d;
  T *dq = g.dq ? g.dq + bh * N * d : nullptr, *dk = g.dk ? g.dk + bh * N * d : nullptr;
  T *dv = g.dv ? g.dv + bh * N * d : nullptr, *da = g.da_c ? g.da_c + bh * C * N : nullptr;
  Members m = group_by_cluster(assign, N, C);
  buf.resize(C * d + 4 * K * d + 2 * N * d + 2 * N * K + N);
  T *d_rest = buf.data(), *kt = d_rest + C * d, *vt = kt + K * d, *dkt = vt + K * d, *dvt = dkt + K * d;
  T *qm = dvt + K * d, *dtop = qm + N * d, *p = dtop + N * d, *dp = p + N * K, *lse_rows = dp + N * K;
  // second term: rest_j = (A^c_j ⊙ outside_j) V, handed to every member
  std::fill(d_rest, d_rest + C * d, T(0));
  for (int64_t i = 0; i < N; ++i)
    if (assign[i] >= 0)
      for (int64_t e = 0; e < d; ++e) d_rest[assign[i] * d + e] += dout[i * d + e];
  if (dv) gemm_tile<T>(dv, a, d_rest, true, false, T(1), T(1), N, d, C);  // dV += A^cᵀ dR (top keys undone below)
  if (da) gemm_tile<T>(da, d_rest, v, false, true, T(1), T(1), C, N, d);  // dA^c += dR Vᵀ (top keys replaced below)
  for (int64_t j = 0; j < C; ++j) {
    const int32_t* tj = top + j * K;
    const int64_t n = m.offset[j + 1] - m.offset[j];
    const int32_t* who = m.order.data() + m.offset[j];
    // dm̂_j = Σ_{i ∈ j} dO_i · y_i
    T dm = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t e = 0; e < d; ++e) dm += dout[who[r] * d + e] * g.top_out[(bh * N + who[r]) * d + e];
    for (int64_t t = 0; t < K; ++t) {
      const int32_t l = tj[t];
      if (l < 0) continue;
      T dot = 0;  // dR_j · V_l, added above for every key
      for (int64_t e = 0; e < d; ++e) dot += d_rest[j * d + e] * v[l * d + e];
      if (da) da[j * N + l] += dm - dot;  // a top key's weight enters through m̂ only
      if (dv)
        for (int64_t e = 0; e < d; ++e) dv[l * d + e] -= a[j * N + l] * d_rest[j * d + e];
    }
    if (n == 0) continue;
    // first term: m̂_j · softmax(Q_i K_Tᵀ/√d) V_T for the members i of j
    const T mh = g.m_hat[bh * C + j];
    gather(kt, k, tj, K, d);
    gather(vt, v, tj, K, d);
    gather(qm, q, who, n, d);
    for (int64_t r = 0; r < n; ++r) {
      lse_rows[r] = g.lse[bh * N + who[r]];
      for (int64_t e = 0; e < d; ++e) dtop[r * d + e] = mh * dout[who[r] * d + e];
    }
    gemm_tile<T>(p, qm, kt, false, true, scale, T(0), n, K, d);
    probabilities_from_lse(p, tj, n, K, lse_rows);
    if (dv) {  // dV_T += Pᵀ dTop
      gemm_tile<T>(dvt, p, dtop, true, false, T(1), T(0), K, d, n);
      scatter_add(dv, dvt, tj, K, d);
    }
    if (!dq && !dk) continue;
    gemm_tile<T>(dp, dtop, vt, false, true, T(1), T(0), n, K, d);  // dP = dTop V_Tᵀ
    softmax_grad_rows(dp, p, n, K);
    if (dq) {  // dQ_i += dS K_T/√d
      gemm_tile<T>(qm, dp, kt, false, false, scale, T(0), n, d, K);
      scatter_add(dq, qm, who, n, d);
      if (dk) gather(qm, q, who, n, d);  // restore the member queries for dK
    }
    if (dk) {  // dK_T += dSᵀ Q/√d
      gemm_tile<T>(dkt, dp, qm, true, false, scale, T(0), K, d, n);
      scatter_add(dk, dkt, tj, K, d);
    }
  }
}

// One thread per head: a key can be a top key of several clusters of its head.
template <class T>
void improved_forward(const ImprovedShape& s, const ImprovedData<T>& x, T* out, T* top_out, T* m_hat, T* lse) {
#pragma omp parallel if (s.BH > 1)
  {
    std::vector<T> buf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.BH; ++bh) improved_forward_head(s, x, bh, out, top_out, m_hat, lse, buf);
  }
}

template <class T>
void improved_backward(const ImprovedShape& s, const ImprovedData<T>& x, const ImprovedGrads<T>& g) {
#pragma omp parallel if (s.BH > 1)
  {
    std::vector<T> buf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.BH; ++bh) improved_backward_head(s, x, g, bh, buf);
  }
}

struct ImprovedClusteredFusedNode final : autograd::Node {
  Tensor q, k, v, a_c;  // inputs
  Tensor top_keys;      // (B, H, C, top) i32
  Tensor assignment;    // (B, H, N) i32
  Tensor top_out;       // saved y_i = softmax(Q_i K_Tᵀ/√d) V_T: (B, H, N, d)
  Tensor m_hat;         // saved m̂_j: (B, H, C)
  Tensor lse;           // saved log-sum-exp of each query's top-key softmax: (B, H, N)
  const char* name() const override { return "improved_clustered_output_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("a_c", a_c);
    visit.input("top_keys", top_keys);
    visit.input("assignment", assignment);
    visit.saved("top_out", top_out);
    visit.saved("m_hat", m_hat);
    visit.saved("lse", lse);
  }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    Tensor da = a_c.requires_grad() ? a_c.grad_accumulator() : Tensor();
    const ImprovedShape s{q.dim(0) * q.dim(1), q.dim(2), a_c.dim(2), top_keys.dim(3), q.dim(3)};
    CAST_DISPATCH_FLOAT(q.dtype(), "improved_clustered_output_fused", [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      ImprovedData<T> x{
          q.data<T>(), k.data<T>(), v.data<T>(), a_c.data<T>(), top_keys.data<int32_t>(), assignment.data<int32_t>()};
      ImprovedGrads<T> g{ptr(dq),           ptr(dk),         ptr(dv),      ptr(da), outputs[0].grad().data<T>(),
                         top_out.data<T>(), m_hat.data<T>(), lse.data<T>()};
      improved_backward(s, x, g);
    });
  }
};

// The kernel takes each cluster's top keys out of A^c V one slot at a time, so a key listed twice
// in a cluster would be taken out twice where the reference's mask takes it out once. ops::topk
// never lists a key twice; anything else is refused.
void check_distinct_top_keys(const char* op, const Tensor& top_keys, int64_t N) {
  const int64_t K = top_keys.dim(3), rows = top_keys.numel() / std::max<int64_t>(K, 1);
  const int32_t* ids = top_keys.data<int32_t>();
  std::vector<int64_t> seen(static_cast<size_t>(N), -1);  // the row that last listed each key
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < K; ++t) {
      const int32_t key = ids[r * K + t];
      if (key < 0) continue;
      CAST_CHECK(seen[key] != r, "{}: cluster {} of head row {} lists key {} twice among its top keys", op,
                 r % top_keys.dim(2), r / top_keys.dim(2), key);
      seen[key] = r;
    }
}

}  // namespace

Tensor improved_clustered_output_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                       const Tensor& top_keys, const Tensor& assignment) {
  const char* op = "improved_clustered_output_fused";
  check_improved_clustered_inputs(op, q, k, v, a_c, top_keys, assignment);
  CAST_CHECK(!q.is_cuda(), "{}: a CPU kernel, got q {} (the GPU's is improved_clustered_output_topkey)", op,
             q.describe());
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3), C = a_c.dim(2);
  check_distinct_top_keys(op, top_keys, N);
  const ImprovedShape s{B * H, N, C, top_keys.dim(3), d};
  Tensor out = Tensor::empty(q.shape(), q.dtype()), top_out = Tensor::empty(q.shape(), q.dtype());
  Tensor m_hat = Tensor::empty({B, H, C}, q.dtype()), lse = Tensor::empty({B, H, N}, q.dtype());
  CAST_DISPATCH_FLOAT(q.dtype(), op, [&] {
    ImprovedData<T> x{
        q.data<T>(), k.data<T>(), v.data<T>(), a_c.data<T>(), top_keys.data<int32_t>(), assignment.data<int32_t>()};
    improved_forward(s, x, out.data<T>(), top_out.data<T>(), m_hat.data<T>(), lse.data<T>());
  });
  if (autograd::needs_grad({&q, &k, &v, &a_c})) {
    auto node = std::make_unique<ImprovedClusteredFusedNode>();
    node->q = q, node->k = k, node->v = v, node->a_c = a_c, node->top_keys = top_keys;
    node->assignment = assignment, node->top_out = top_out, node->m_hat = m_hat, node->lse = lse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath improved_clustered_output_fused_path() {
  return fast_path<ImprovedClusteredOutputInputs>("improved_clustered_output_fused", __FILE__, "CPU f32/f64", cpu_float,
                                                  [](const ImprovedClusteredOutputInputs& in) {
                                                    return improved_clustered_output_fused(in.q, in.k, in.v, in.a_c,
                                                                                           in.top_keys, in.assignment);
                                                  });
}

}  // namespace cast::ops
