#include "ops/cluster_fused.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/fast_math.h"
#include "ops/matmul.h"
#include "ops/rows.h"
#ifdef CAST_WITH_CUDA
#include "cuda/clustering.h"
#include "cuda/flash_attention.h"
#endif

namespace cast::ops {

namespace {

// rows (n, d) = the rows ids[0..n) of table (N, d); an id of −1 gives a zero row
template <class T>
void gather(T* rows, const T* table, const int32_t* ids, int64_t n, int64_t d) {
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0) std::fill(rows + r * d, rows + (r + 1) * d, T(0));
    else std::copy(table + ids[r] * d, table + (ids[r] + 1) * d, rows + r * d);
  }
}

// table rows ids[r] += rows r (ids of −1 skipped)
template <class T>
void scatter_add(T* table, const T* rows, const int32_t* ids, int64_t n, int64_t d) {
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] < 0) continue;
    T* dst = table + ids[r] * d;
    const T* src = rows + r * d;
#pragma omp simd
    for (int64_t e = 0; e < d; ++e) dst[e] += src[e];
  }
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// Softmax of each row of s (rows, cols) over the columns whose id is ≥ 0, in place; lse[r]
// gets the row's log-sum-exp (−∞ and a zero row when no column is valid).
template <class T>
void softmax_rows(T* s, const int32_t* col_ids, int64_t rows, int64_t cols, T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * cols;
    for (int64_t c = 0; c < cols; ++c)
      if (col_ids[c] < 0) row[c] = static_cast<T>(-kInf);
    const T mx = max_of(row, cols);
    if (mx == static_cast<T>(-kInf)) {  // no valid column, or only NaN: NaN must stay NaN
      bool nan = false;
      for (int64_t c = 0; c < cols; ++c) nan = nan || std::isnan(row[c]);
      std::fill(row, row + cols, nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
      lse[r] = nan ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(-kInf);
      continue;
    }
    const T total = exp_shifted(row, cols, mx);
    lse[r] = mx + std::log(total);
    const T inv = T(1) / total;  // NaN in a row holding a NaN: its empty slots stay 0 (ops/fast_math.h)
    for (int64_t c = 0; c < cols; ++c) row[c] = col_ids[c] < 0 ? T(0) : row[c] * inv;
  }
}

// P = exp(S − lse) in place from recomputed scores, 0 in invalid columns and empty rows.
template <class T>
void probabilities_from_lse(T* s, const int32_t* col_ids, int64_t rows, int64_t cols, const T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * cols;
    for (int64_t c = 0; c < cols; ++c)
      if (col_ids[c] < 0) row[c] = static_cast<T>(-kInf);
    exp_shifted(row, cols, lse[r] == static_cast<T>(-kInf) ? static_cast<T>(kInf) : lse[r]);
  }
}

// dS = P ⊙ (dP − Σ_c P·dP) in place of dP, row by row
template <class T>
void softmax_grad_rows(T* dp, const T* p, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    T* g = dp + r * cols;
    const T* pr = p + r * cols;
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < cols; ++c) dot += pr[c] * g[c];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) g[c] = pr[c] * (g[c] - dot);
  }
}

// ---------------------------------------------------------------- intra-cluster attention
struct IntraShape {
  int64_t BH, N, C, kappa, d;
};

template <class T>
void intra_forward(const IntraShape& s, const T* q, const T* k, const T* v, const int32_t* members, T* out,
                   T* lse) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const int64_t K = s.kappa, d = s.d;
#pragma omp parallel if (s.BH * s.C > 1)
  {
    std::vector<T> qc(K * d), kc(K * d), vc(K * d), p(K * K);
#pragma omp for schedule(dynamic, 4)
    for (int64_t cluster = 0; cluster < s.BH * s.C; ++cluster) {  // cluster = bh·C + c
      const int64_t bh = cluster / s.C;
      const int32_t* ids = members + cluster * K;
      gather(qc.data(), q + bh * s.N * d, ids, K, d);
      gather(kc.data(), k + bh * s.N * d, ids, K, d);
      gather(vc.data(), v + bh * s.N * d, ids, K, d);
      gemm_tile<T>(p.data(), qc.data(), kc.data(), false, true, scale, T(0), K, K, d);  // S = Qc Kcᵀ/√d
      softmax_rows(p.data(), ids, K, K, lse + cluster * K);                           // P over filled slots
      gemm_tile<T>(out + cluster * K * d, p.data(), vc.data(), false, false, T(1), T(0), K, d, K);  // P Vc
    }
  }
}

template <class T>
void intra_backward(const IntraShape& s, const T* q, const T* k, const T* v, const int32_t* members, const T* lse,
                    const T* dout, T* dq, T* dk, T* dv) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const int64_t K = s.kappa, d = s.d;
  // A token may sit in several clusters of its head: one thread owns each head's gradients.
#pragma omp parallel if (s.BH > 1)
  {
    std::vector<T> qc(K * d), kc(K * d), vc(K * d), p(K * K), dp(K * K), rows(K * d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.BH; ++bh) {
      for (int64_t c = 0; c < s.C; ++c) {
        const int64_t cluster = bh * s.C + c;
        const int32_t* ids = members + cluster * K;
        const T* dout_c = dout + cluster * K * d;  // (κ, d)
        gather(qc.data(), q + bh * s.N * d, ids, K, d);
        gather(kc.data(), k + bh * s.N * d, ids, K, d);
        gather(vc.data(), v + bh * s.N * d, ids, K, d);
        gemm_tile<T>(p.data(), qc.data(), kc.data(), false, true, scale, T(0), K, K, d);
        probabilities_from_lse(p.data(), ids, K, K, lse + cluster * K);
        if (dv) {  // dVc = Pᵀ dO
          gemm_tile<T>(rows.data(), p.data(), dout_c, true, false, T(1), T(0), K, d, K);
          scatter_add(dv + bh * s.N * d, rows.data(), ids, K, d);
        }
        if (!dq && !dk) continue;
        gemm_tile<T>(dp.data(), dout_c, vc.data(), false, true, T(1), T(0), K, K, d);  // dP = dO Vcᵀ
        softmax_grad_rows(dp.data(), p.data(), K, K);                                 // dS
        if (dq) {  // dQc = dS Kc/√d
          gemm_tile<T>(rows.data(), dp.data(), kc.data(), false, false, scale, T(0), K, d, K);
          scatter_add(dq + bh * s.N * d, rows.data(), ids, K, d);
        }
        if (dk) {  // dKc = dSᵀ Qc/√d
          gemm_tile<T>(rows.data(), dp.data(), qc.data(), true, false, scale, T(0), K, d, K);
          scatter_add(dk + bh * s.N * d, rows.data(), ids, K, d);
        }
      }
    }
  }
}

struct IntraClusterFusedNode final : autograd::Node {
  Tensor q, k, v;   // inputs (B, H, N, d)
  Tensor members;   // (B, H, C, κ) i32
  Tensor lse;       // saved row log-sum-exp of each slot's softmax: (B, H, C, κ)
  const char* name() const override { return "intra_cluster_attention_fused"; }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    const IntraShape s{q.dim(0) * q.dim(1), q.dim(2), members.dim(2), members.dim(3), q.dim(3)};
    CAST_DISPATCH_FLOAT(q.dtype(), "intra_cluster_attention_fused", [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      intra_backward<T>(s, q.data<T>(), k.data<T>(), v.data<T>(), members.data<int32_t>(), lse.data<T>(),
                        outputs[0].grad().data<T>(), ptr(dq), ptr(dk), ptr(dv));
    });
  }
};

#ifdef CAST_WITH_CUDA
// On the GPU each cluster is one flash-attention problem: its κ member rows of Q, K and V are
// gathered (an empty slot a zero row), and flash attention runs over them with the filled slots
// as the key mask, so no κ × κ matrix is stored; the gradients go back to the tokens by
// scatter-adding the gathered rows' gradients.
struct IntraClusterCudaNode final : autograd::Node {
  Tensor q, k, v;       // inputs (B, H, N, d)
  Tensor idx;           // members as (B·H, C·κ)
  Tensor qc, kc, vc;    // gathered rows (B·H·C, 1, κ, d)
  Tensor slots;         // (B·H·C, κ): 1 filled, 0 empty
  Tensor out, lse;      // (B·H·C, 1, κ, d) and its log-sum-exp
  const char* name() const override { return "intra_cluster_attention_fused (CUDA)"; }
  void backward() override {
    const int64_t BH = idx.dim(0), N = q.dim(2), d = q.dim(3);
    Tensor dqc = Tensor::zeros(qc.shape(), qc.dtype(), qc.device());
    Tensor dkc = Tensor::zeros(kc.shape(), kc.dtype(), kc.device());
    Tensor dvc = Tensor::zeros(vc.shape(), vc.dtype(), vc.device());
    cuda::flash_attention_backward(&dqc, &dkc, &dvc, outputs[0].grad().view(out.shape()), qc, kc, vc, slots, out,
                                   lse);
    auto back = [&](Tensor& input, const Tensor& rows) {
      if (!input.requires_grad()) return;
      Tensor dx = input.grad_accumulator().view({BH, N, d});
      gather_rows_backward(dx, rows.view({BH, idx.dim(1), d}), idx);
    };
    back(q, dqc);
    back(k, dkc);
    back(v, dvc);
  }
};

Tensor intra_cluster_attention_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3), C = members.dim(2), K = members.dim(3);
  Tensor idx = members.view({B * H, C * K});
  auto gather = [&](const Tensor& t) {
    Tensor rows = Tensor::empty({B * H, C * K, d}, t.dtype(), t.device());
    gather_rows_forward(rows, t.view({B * H, N, d}), idx);
    return rows.view({B * H * C, 1, K, d});
  };
  Tensor qc = gather(q), kc = gather(k), vc = gather(v);
  Tensor slots = Tensor::empty({B * H * C, K}, q.dtype(), q.device());
  cuda::slot_mask(slots, members);
  Tensor out = Tensor::empty(qc.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({B * H * C, 1, K}, q.dtype(), q.device());
  cuda::flash_attention_forward(out, lse, qc, kc, vc, slots);
  Tensor result = out.view({B, H, C, K, d});
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterCudaNode>();
    node->q = q, node->k = k, node->v = v, node->idx = idx;
    node->qc = qc, node->kc = kc, node->vc = vc, node->slots = slots, node->out = out, node->lse = lse;
    node->outputs = {result};
    autograd::record(std::move(node));
  }
  return result;
}
#endif

void check_heads(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_float(op, q, "q");
  check_ndim(op, q, 4, "q");
  check_same_shape(op, q, k);
  check_same_shape(op, q, v);
  check_same_dtype(op, q, k);
  check_same_dtype(op, q, v);
  check_same_device(op, q, k);
  check_same_device(op, q, v);
}

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
  const T *q, *k, *v, *a_c;   // (BH, N, d) ×3, (BH, C, N)
  const int32_t *top, *assign;  // (BH, C, top), (BH, N)
};

// For one head: m̂_j, rest_j = (A^c_j ⊙ 1[l ∉ T_j]) V and each query's top-key output y_i.
template <class T>
void improved_forward_head(const ImprovedShape& s, const ImprovedData<T>& x, int64_t bh, T* out, T* top_out,
                           T* m_hat, T* lse, std::vector<T>& buf) {
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
      lse[bh * N + i] = static_cast<T>(-kInf);
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
  Tensor q, k, v, a_c;       // inputs
  Tensor top_keys;           // (B, H, C, top) i32
  Tensor assignment;         // (B, H, N) i32
  Tensor top_out;            // saved y_i = softmax(Q_i K_Tᵀ/√d) V_T: (B, H, N, d)
  Tensor m_hat;              // saved m̂_j: (B, H, C)
  Tensor lse;                // saved log-sum-exp of each query's top-key softmax: (B, H, N)
  const char* name() const override { return "improved_clustered_output_fused"; }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    Tensor da = a_c.requires_grad() ? a_c.grad_accumulator() : Tensor();
    const ImprovedShape s{q.dim(0) * q.dim(1), q.dim(2), a_c.dim(2), top_keys.dim(3), q.dim(3)};
    CAST_DISPATCH_FLOAT(q.dtype(), "improved_clustered_output_fused", [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      ImprovedData<T> x{q.data<T>(), k.data<T>(), v.data<T>(), a_c.data<T>(), top_keys.data<int32_t>(),
                        assignment.data<int32_t>()};
      ImprovedGrads<T> g{ptr(dq), ptr(dk), ptr(dv), ptr(da), outputs[0].grad().data<T>(), top_out.data<T>(),
                         m_hat.data<T>(), lse.data<T>()};
      improved_backward(s, x, g);
    });
  }
};

}  // namespace

Tensor intra_cluster_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  const char* op = "intra_cluster_attention_fused";
  check_heads(op, q, k, v);
  check_ndim(op, members, 4, "members");
  check_dtype(op, members, DType::i32, "members");
  check_same_device(op, q, members);
  CAST_CHECK(members.dim(0) == q.dim(0) && members.dim(1) == q.dim(1), "{}: members {} do not fit q {}", op,
             members.describe(), q.describe());
  check_index_range(op, members, -1, q.dim(2));
#ifdef CAST_WITH_CUDA
  if (q.is_cuda()) return intra_cluster_attention_cuda(q, k, v, members);
#endif
  const IntraShape s{q.dim(0) * q.dim(1), q.dim(2), members.dim(2), members.dim(3), q.dim(3)};
  Tensor out = Tensor::empty({q.dim(0), q.dim(1), s.C, s.kappa, s.d}, q.dtype());
  Tensor lse = Tensor::empty({q.dim(0), q.dim(1), s.C, s.kappa}, q.dtype());
  CAST_DISPATCH_FLOAT(q.dtype(), op, [&] {
    intra_forward<T>(s, q.data<T>(), k.data<T>(), v.data<T>(), members.data<int32_t>(), out.data<T>(),
                     lse.data<T>());
  });
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterFusedNode>();
    node->q = q, node->k = k, node->v = v, node->members = members, node->lse = lse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

Tensor improved_clustered_output_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                       const Tensor& top_keys, const Tensor& assignment) {
  const char* op = "improved_clustered_output_fused";
  check_heads(op, q, k, v);
  CAST_CHECK(!q.is_cuda(), "{}: a CPU op, got q {} (the GPU runs the step ops)", op, q.describe());
  check_same_dtype(op, q, a_c);
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  CAST_CHECK(a_c.ndim() == 4 && a_c.dim(0) == B && a_c.dim(1) == H && a_c.dim(3) == N,
             "{}: a_c {} must be [{}, {}, C, {}]", op, a_c.describe(), B, H, N);
  const int64_t C = a_c.dim(2);
  check_dtype(op, top_keys, DType::i32, "top_keys");
  check_dtype(op, assignment, DType::i32, "assignment");
  CAST_CHECK(top_keys.ndim() == 4 && top_keys.dim(0) == B && top_keys.dim(1) == H && top_keys.dim(2) == C,
             "{}: top_keys {} must be [{}, {}, {}, k]", op, top_keys.describe(), B, H, C);
  CAST_CHECK(assignment.shape() == (Shape{B, H, N}), "{}: assignment {} must be [{}, {}, {}]", op,
             assignment.describe(), B, H, N);
  check_same_device(op, q, a_c);
  check_same_device(op, q, top_keys);
  check_same_device(op, q, assignment);
  check_index_range(op, top_keys, -1, N);
  check_index_range(op, assignment, -1, C);
  const ImprovedShape s{B * H, N, C, top_keys.dim(3), d};
  Tensor out = Tensor::empty(q.shape(), q.dtype()), top_out = Tensor::empty(q.shape(), q.dtype());
  Tensor m_hat = Tensor::empty({B, H, C}, q.dtype()), lse = Tensor::empty({B, H, N}, q.dtype());
  CAST_DISPATCH_FLOAT(q.dtype(), op, [&] {
    ImprovedData<T> x{q.data<T>(), k.data<T>(), v.data<T>(), a_c.data<T>(), top_keys.data<int32_t>(),
                      assignment.data<int32_t>()};
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

}  // namespace cast::ops
