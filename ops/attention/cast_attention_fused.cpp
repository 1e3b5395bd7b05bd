#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/tape.h"
#include "ops/attention/affinity_rows.h"
#include "ops/attention/clustering.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/fused_rows.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

// CAST steps 1–3 and 5–7 as one op on the CPU, given the clusters of step 4. The step ops
// (ops/attention/<step>.cpp), and their fast paths one by one, each write a (B, H, N, C) or
// (B, H, C, κ, d) tensor that the next reads, and the tape keeps A_q, A_k, A_g, P and R_intra
// for the backward. Here one thread takes a (batch, head) group at a time and runs every step of
// it with the group's affinities in its own scratch. The backward keeps nothing per token but the
// gate g: it forms the affinities again a tile of rows at a time (the same rows, bit for bit) and
// each cluster's tile of R_intra from its saved row log-sum-exp, as flash attention recomputes
// its scores, so its scratch is a few tiles, not the group's (N, C) matrices.
namespace cast::ops {

namespace {
using namespace fused_rows;

struct CastShape {
  int64_t B, H, N, d, C, kappa;
  AttentionFn f;
  bool summaries, mix_query;
};
constexpr int64_t kTileRows = 64;       // rows of the affinities formed or read at once
constexpr int64_t kBackwardRows = 256;  // rows of the backward's tiles: products of 256 rows run near the tile rate

// The scratch of one thread, in floats. The forward holds the group's affinities A_q and A_k
// (N, C) each, and A_g where it chooses the clusters; the backward holds one row tile of each,
// the gradients of those tiles and the slots' share of dW. Both hold a cluster's tiles.
struct Scratch {
  int64_t aq, ak, ag, da_q, da_k, totals, tile, dot, r_inter_grad, slot_dw, qc, kc, vc, p, dp, r, dr, floats;
  Scratch(const CastShape& s, bool backward, bool choosing) {
    const int64_t rows = backward ? std::min(kBackwardRows, s.N) : s.N;
    const int64_t kd = s.kappa * s.d, kk = s.kappa * s.kappa, slots = s.C * s.kappa;
    int64_t at = 0;
    auto take = [&](int64_t n) { return std::exchange(at, at + n); };
    aq = take(rows * s.C), ak = take(rows * s.C), ag = take(choosing ? s.N * s.C : 0);
    da_q = take(backward ? rows * s.C : 0), da_k = take(backward ? rows * s.C : 0);
    totals = take(2 * rows), tile = take((backward ? rows : kTileRows) * s.C), dot = take(s.C),
    r_inter_grad = take(s.C * s.d);
    slot_dw = take(backward ? slots : 0);
    qc = take(kd), kc = take(kd), vc = take(kd), p = take(kk), dp = take(kk), r = take(kd), dr = take(kd);
    floats = at;
  }
  // int32s per thread for the backward: each token's slots (N + 1 offsets and C·κ slot indices)
  static int64_t ints(const CastShape& s) { return s.N + 1 + s.C * s.kappa; }
};

// One (batch, head) group's inputs: rows of q, k, v (N, d), its surrogates (C, d), the mask row,
// its gate values (N, stride H) and its members (C, κ).
template <class T>
struct Group {
  const T *q, *k, *v, *s, *mask, *g;
  const int32_t* members;
  int64_t g_stride;
  T gate(int64_t i) const { return g[i * g_stride]; }
};

template <class T>
Group<T> group_of(const CastShape& s, int64_t bh, const T* q, const T* k, const T* v, const T* sur, const T* mask,
                  const T* g, const int32_t* members) {
  const int64_t b = bh / s.H, h = bh % s.H, rows = s.N * s.d;
  return {q + bh * rows,
          k + bh * rows,
          v + bh * rows,
          sur + h * s.C * s.d,
          mask ? mask + b * s.N : nullptr,
          g + b * s.N * s.H + h,
          members + bh * s.C * s.kappa,
          s.H};
}

// a (rows, C) = f-rows of x (rows, d) Sᵀ/√d, a tile at a time as cluster_affinities_fused forms
// them; total (rows): the Laplace rows' sums.
template <class T>
void affinities(T* a, T* total, const T* x, const TileOperand<T>& s_t, const CastShape& s, int64_t rows) {
  const T factor = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int64_t n = std::min(kTileRows, rows - r0);
    T* tile = a + r0 * s.C;
    s_t.multiply(tile, x + r0 * s.d, false, factor, T(0), n);
    for (int64_t r = 0; r < n; ++r) {
      T* row = tile + r * s.C;
      if (s.f == AttentionFn::softmax) softmax_row<T>(row, row, nullptr, s.C, false);
      else total[r0 + r] = affinity_rows::laplace_row(row, s.C);
    }
  }
}

// A_g[i, c] = A_k + g (A_q − A_k), at = i·C + c
template <class T>
T gated(const T* aq, const T* ak, T g, int64_t at) {
  return ak[at] + g * (aq[at] - ak[at]);
}

// The mixing weight W[i, c]: A_q, or A_g
template <class T>
T weight(const CastShape& s, const T* aq, const T* ak, T g, int64_t at) {
  return s.mix_query ? aq[at] : gated(aq, ak, g, at);
}

// out (rows, C) = W of rows [r0, r0 + rows), from aq and ak (rows, C) of those rows
template <class T>
void weight_tile(T* out, const CastShape& s, const Group<T>& in, const T* aq, const T* ak, int64_t r0, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const T g = s.mix_query ? T(0) : in.gate(r0 + r);
    for (int64_t c = 0; c < s.C; ++c) out[r * s.C + c] = weight(s, aq, ak, g, r * s.C + c);
  }
}

// colsum (C) = Σ_i A_k[i,c] m_i + 1e-30, in token order as the reference sums
template <class T>
void column_sums(T* colsum, const CastShape& s, const Group<T>& in, const T* ak) {
  std::fill(colsum, colsum + s.C, T(0));
  for (int64_t i = 0; i < s.N; ++i) {
    const T m = in.mask ? in.mask[i] : T(1);
    for (int64_t c = 0; c < s.C; ++c) colsum[c] += ak[i * s.C + c] * m;
  }
  for (int64_t c = 0; c < s.C; ++c) colsum[c] += T(1e-30);
}

// out (rows, C) = P of rows [r0, r0 + rows): A_k m / colsum, from ak (rows, C) of those rows
template <class T>
void summary_weight_tile(T* out, const CastShape& s, const Group<T>& in, const T* ak, const T* colsum, int64_t r0,
                         int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    const T m = in.mask ? in.mask[r0 + r] : T(1);
    for (int64_t c = 0; c < s.C; ++c) out[r * s.C + c] = ak[r * s.C + c] * m / colsum[c];
  }
}

// One cluster's R_intra tile r (κ, d) = softmax(Qc Kcᵀ/√d + slot mask) Vc, with Qc, Kc, Vc
// gathered into the scratch; p holds the probabilities. The forward writes the rows' log-sum-exp
// to lse_out; the backward passes it as lse_in and the probabilities are recomputed from it.
template <class T>
void intra_tile(const CastShape& s, const Group<T>& in, int64_t c, T* lse_out, const T* lse_in, T* base,
                const Scratch& at) {
  const int64_t K = s.kappa, d = s.d;
  const int32_t* ids = in.members + c * K;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  T *qc = base + at.qc, *kc = base + at.kc, *vc = base + at.vc, *p = base + at.p;
  gather(qc, in.q, ids, K, d);
  gather(kc, in.k, ids, K, d);
  gather(vc, in.v, ids, K, d);
  gemm_tile<T>(p, qc, kc, false, true, scale, T(0), K, K, d);
  if (lse_in) probabilities_from_lse(p, ids, K, K, lse_in);
  else softmax_rows(p, ids, K, K, lse_out);
  gemm_tile<T>(base + at.r, p, vc, false, false, T(1), T(0), K, d, K);
}

// Step 4 inside the op: members (C, κ) = the Top-K clusters of A_g = A_k + g (A_q − A_k), as
// cluster_topk chooses them.
template <class T>
void choose_clusters(const CastShape& s, const Group<T>& in, const T* aq, const T* ak, T* ag, int32_t* members) {
  std::vector<int32_t> real;  // the real tokens in position order
  for (int64_t i = 0; i < s.N; ++i) {
    if (in.mask && in.mask[i] == T(0)) continue;
    real.push_back(static_cast<int32_t>(i));
    const T g = in.gate(i);
    for (int64_t c = 0; c < s.C; ++c) ag[i * s.C + c] = gated(aq, ak, g, i * s.C + c);
  }
  std::fill(members, members + s.C * s.kappa, -1);
  cluster_topk_group(ag, s.C, real, s.kappa, members);
}

// What the forward of one group writes besides its output, and the backward reads: r_inter
// (C, d) and colsum (C) with summaries on, each slot's log-sum-exp and mixing weight W (C, κ).
template <class T>
struct GroupSaved {
  T *r_inter, *colsum, *lse, *slot_w;
};

// out (N, d) of one group: the dense part W R_inter, then each cluster's R_intra and its slots'
// terms W[i,c] (R_intra[c][p] − R_inter[c]). With `chosen`, the clusters are chosen here first and
// written there (in.members is the same array).
template <class T>
void group_forward(const CastShape& s, const Group<T>& in, T* out, const GroupSaved<T>& saved, int32_t* chosen, T* base,
                   const Scratch& at) {
  T *aq = base + at.aq, *ak = base + at.ak, *tile = base + at.tile;
  TileOperand<T> s_t;
  s_t.set(in.s, true, s.C, s.d);
  affinities(aq, base + at.totals, in.q, s_t, s, s.N);
  affinities(ak, base + at.totals + s.N, in.k, s_t, s, s.N);
  if (chosen) choose_clusters(s, in, aq, ak, base + at.ag, chosen);
  if (s.summaries) {
    T* r_inter = saved.r_inter;
    column_sums(saved.colsum, s, in, ak);
    for (int64_t r0 = 0; r0 < s.N; r0 += kTileRows) {  // R_inter = Pᵀ V
      const int64_t rows = std::min(kTileRows, s.N - r0);
      summary_weight_tile(tile, s, in, ak + r0 * s.C, saved.colsum, r0, rows);
      gemm_tile<T>(r_inter, tile, in.v + r0 * s.d, true, false, T(1), r0 == 0 ? T(0) : T(1), s.C, s.d, rows);
    }
    if (s.N == 0) std::fill(r_inter, r_inter + s.C * s.d, T(0));
    for (int64_t r0 = 0; r0 < s.N; r0 += kTileRows) {  // O = W R_inter
      const int64_t rows = std::min(kTileRows, s.N - r0);
      weight_tile(tile, s, in, aq + r0 * s.C, ak + r0 * s.C, r0, rows);
      gemm_tile<T>(out + r0 * s.d, tile, r_inter, false, false, T(1), T(0), rows, s.d, s.C);
    }
  } else {
    std::fill(out, out + s.N * s.d, T(0));
  }
  const T* r = base + at.r;
  for (int64_t c = 0; c < s.C; ++c) {
    intra_tile(s, in, c, saved.lse + c * s.kappa, static_cast<const T*>(nullptr), base, at);
    const int32_t* ids = in.members + c * s.kappa;
    const T* r0 = s.summaries ? saved.r_inter + c * s.d : nullptr;
    for (int64_t p = 0; p < s.kappa; ++p) {
      const int64_t i = ids[p];
      T& w_saved = saved.slot_w[c * s.kappa + p];
      if (i < 0) {
        w_saved = T(0);
        continue;
      }
      const T w = weight(s, aq, ak, s.mix_query ? T(0) : in.gate(i), i * s.C + c);
      w_saved = w;
      const T* rp = r + p * s.d;
      T* o = out + i * s.d;
      if (r0) {
#pragma omp simd
        for (int64_t e = 0; e < s.d; ++e) o[e] += w * (rp[e] - r0[e]);
      } else {
#pragma omp simd
        for (int64_t e = 0; e < s.d; ++e) o[e] += w * rp[e];
      }
    }
  }
}

// The gradients of one group, added to: dq, dk, dv (N, d) and the gate's dg (N, stride H); dsur
// (C, d), written, is this group's share of the surrogates' gradient. Any may be null.
template <class T>
struct GroupGrads {
  T *dq, *dk, *dv, *dg, *dsur;
};

// Each token's slots, so that a row tile finds the slot terms of its dW: the slots of token i are
// slot[first[i] .. first[i + 1]), each an index c·κ + p into members (C, κ). A token of Top-K can
// sit in several clusters.
struct SlotsByToken {
  int32_t *first, *slot;
  SlotsByToken(int32_t* ints, const int32_t* members, int64_t N, int64_t slots) : first(ints), slot(ints + N + 1) {
    std::fill(first, first + N + 1, 0);
    for (int64_t j = 0; j < slots; ++j)
      if (members[j] >= 0) ++first[members[j] + 1];
    for (int64_t i = 0; i < N; ++i) first[i + 1] += first[i];
    for (int64_t j = 0; j < slots; ++j)  // first[i] runs to token i's end while it places them
      if (members[j] >= 0) slot[first[members[j]]++] = static_cast<int32_t>(j);
    for (int64_t i = N; i > 0; --i) first[i] = first[i - 1];
    first[0] = 0;
  }
};

// Every cluster's R_intra tile again, its slots' share of dW (slot_dw (C, κ)) and of dR_inter,
// and step 5's backward.
template <class T>
void clusters_backward(const CastShape& s, const Group<T>& in, const T* dout, const GroupSaved<T>& saved,
                       const GroupGrads<T>& out, T* base, const Scratch& at) {
  const int64_t K = s.kappa, d = s.d;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  T *slot_dw = base + at.slot_dw, *dri = base + at.r_inter_grad;
  T *qc = base + at.qc, *kc = base + at.kc, *vc = base + at.vc, *p = base + at.p, *dp = base + at.dp;
  T *r = base + at.r, *dr = base + at.dr;
  for (int64_t c = 0; c < s.C; ++c) {
    const int32_t* ids = in.members + c * K;
    intra_tile(s, in, c, static_cast<T*>(nullptr), saved.lse + c * K, base, at);
    const T* r0 = s.summaries ? saved.r_inter + c * d : nullptr;
    for (int64_t slot = 0; slot < K; ++slot) {
      const int64_t i = ids[slot];
      T* drp = dr + slot * d;
      if (i < 0) {
        slot_dw[c * K + slot] = T(0);
        std::fill(drp, drp + d, T(0));
        continue;
      }
      const T w = saved.slot_w[c * K + slot];
      const T *g = dout + i * d, *rp = r + slot * d;
      T part = 0;
      if (r0) {
#pragma omp simd reduction(+ : part)
        for (int64_t e = 0; e < d; ++e) part += g[e] * (rp[e] - r0[e]);
        T* dri_c = dri + c * d;
#pragma omp simd
        for (int64_t e = 0; e < d; ++e) dri_c[e] -= w * g[e];
      } else {
#pragma omp simd reduction(+ : part)
        for (int64_t e = 0; e < d; ++e) part += g[e] * rp[e];
      }
      slot_dw[c * K + slot] = part;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) drp[e] = w * g[e];
    }
    T* rows = r;   // R_intra's tile is spent: it holds the rows scattered back to the tokens
    if (out.dv) {  // dVc = Pᵀ dR
      gemm_tile<T>(rows, p, dr, true, false, T(1), T(0), K, d, K);
      scatter_add(out.dv, rows, ids, K, d);
    }
    if (!out.dq && !out.dk) continue;
    gemm_tile<T>(dp, dr, vc, false, true, T(1), T(0), K, K, d);  // dP = dR Vcᵀ
    softmax_grad_rows(dp, p, K, K);                              // dS
    if (out.dq) {                                                // dQc = dS Kc/√d
      gemm_tile<T>(rows, dp, kc, false, false, scale, T(0), K, d, K);
      scatter_add(out.dq, rows, ids, K, d);
    }
    if (out.dk) {  // dKc = dSᵀ Qc/√d
      gemm_tile<T>(rows, dp, qc, true, false, scale, T(0), K, d, K);
      scatter_add(out.dk, rows, ids, K, d);
    }
  }
}

// The score gradient of one side's affinities of rows [r0, r0 + rows) in place of dA (rows, C),
// then dx += dS S/√d and dsur += dSᵀ x/√d. a and total are the rows' affinities and Laplace sums.
template <class T>
void affinities_backward(const CastShape& s, const T* x, const T* a, const T* total, const Group<T>& in,
                         const TileOperand<T>& s_t, T* da, T* dx, T* dsur, T* tile, int64_t r0, int64_t rows) {
  const T factor = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  x += r0 * s.d;
  if (s.f == AttentionFn::softmax) {
    softmax_grad_rows(da, a, rows, s.C);
  } else {
    s_t.multiply(tile, x, false, factor, T(0), rows);  // the scores again
    for (int64_t r = 0; r < rows; ++r) {
      T* scores = tile + r * s.C;
      affinity_rows::laplace_gradient_row(scores, da + r * s.C, a + r * s.C, total[r], s.C);
      std::copy(scores, scores + s.C, da + r * s.C);
    }
  }
  if (dx) gemm_tile<T>(dx + r0 * s.d, da, in.s, false, false, factor, T(1), rows, s.d, s.C);
  if (dsur) gemm_tile<T>(dsur, da, x, true, false, factor, T(1), s.C, s.d, rows);
}

// Steps 7 (its dense part), 6, 3 and 2–1 backward for rows [r0, r0 + rows), once dR_inter, the
// slots' dW and dot (C) = Σ_tokens P·dP are known. `formed`: the rows' affinities and Laplace
// sums are in the scratch already.
template <class T>
void rows_backward(const CastShape& s, const Group<T>& in, const T* dout, const GroupSaved<T>& saved,
                   const SlotsByToken& slots, const TileOperand<T>& s_t, const GroupGrads<T>& out, T* base,
                   const Scratch& at, int64_t r0, int64_t rows, bool formed) {
  T *aq = base + at.aq, *ak = base + at.ak, *dw = base + at.da_q, *dak = base + at.da_k, *tile = base + at.tile;
  T *total_q = base + at.totals, *total_k = total_q + std::min(kBackwardRows, s.N);
  const T *dri = base + at.r_inter_grad, *slot_dw = base + at.slot_dw, *dot = base + at.dot;
  const T* colsum = saved.colsum;
  if (!formed) {
    affinities(aq, total_q, in.q + r0 * s.d, s_t, s, rows);
    affinities(ak, total_k, in.k + r0 * s.d, s_t, s, rows);
  }
  // step 7: dW = dO R_interᵀ and each slot's term
  if (s.summaries) gemm_tile<T>(dw, dout + r0 * s.d, saved.r_inter, false, true, T(1), T(0), rows, s.C, s.d);
  else std::fill(dw, dw + rows * s.C, T(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t j = slots.first[r0 + r]; j < slots.first[r0 + r + 1]; ++j)
      dw[r * s.C + slots.slot[j] / s.kappa] += slot_dw[slots.slot[j]];
  // step 6: dV += P dR_inter; dA_k = m (dP − Σ_tokens P·dP) / colsum with dP = V dR_interᵀ
  if (s.summaries) {
    summary_weight_tile(tile, s, in, ak, colsum, r0, rows);
    if (out.dv) gemm_tile<T>(out.dv + r0 * s.d, tile, dri, false, false, T(1), T(1), rows, s.d, s.C);
    gemm_tile<T>(dak, in.v + r0 * s.d, dri, false, true, T(1), T(0), rows, s.C, s.d);
    for (int64_t r = 0; r < rows; ++r) {
      const T m = in.mask ? in.mask[r0 + r] : T(1);
      // divided before the mask, as the reference: an overflowed quotient gives inf · 0 = NaN there too
      for (int64_t c = 0; c < s.C; ++c) dak[r * s.C + c] = (dak[r * s.C + c] - dot[c]) / colsum[c] * m;
    }
  } else {
    std::fill(dak, dak + rows * s.C, T(0));
  }
  // step 3: dA_q = g dA_g, dA_k += (1 − g) dA_g, the gate's dg = Σ_c dA_g (A_q − A_k); with
  // W = A_q the gradient of W is A_q's and the gate gets none
  if (!s.mix_query)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r0 + r;
      const T g = in.gate(i), rest = T(1) - g;
      T *dwi = dw + r * s.C, *dki = dak + r * s.C;
      const T *qi = aq + r * s.C, *ki = ak + r * s.C;
      T dg = 0;
#pragma omp simd reduction(+ : dg)
      for (int64_t c = 0; c < s.C; ++c) dg += dwi[c] * (qi[c] - ki[c]);
      if (out.dg) out.dg[i * s.H] += dg;
#pragma omp simd
      for (int64_t c = 0; c < s.C; ++c) {
        dki[c] += dwi[c] * rest;
        dwi[c] *= g;
      }
    }
  // steps 1–2, the queries' side and then the keys'
  affinities_backward(s, in.q, aq, total_q, in, s_t, dw, out.dq, out.dsur, tile, r0, rows);
  affinities_backward(s, in.k, ak, total_k, in, s_t, dak, out.dk, out.dsur, tile, r0, rows);
}

// The backward of one group, a row tile at a time: dR_inter's dense part Wᵀ dO over every row
// tile, then the clusters (steps 7 and 5), then each row tile's own gradients. The affinities are
// formed twice, as the price of keeping no (N, C) matrix: dR_inter must be whole before any
// row's dA_k. A group of one tile keeps them from the first pass.
template <class T>
void group_backward(const CastShape& s, const Group<T>& in, const T* dout, const GroupSaved<T>& saved,
                    const GroupGrads<T>& out, T* base, int32_t* ints, const Scratch& at) {
  T *aq = base + at.aq, *ak = base + at.ak, *tile = base + at.tile, *dri = base + at.r_inter_grad;
  TileOperand<T> s_t;
  s_t.set(in.s, true, s.C, s.d);
  if (out.dsur) std::fill(out.dsur, out.dsur + s.C * s.d, T(0));
  T *total_q = base + at.totals, *total_k = total_q + std::min(kBackwardRows, s.N);
  const bool one_tile = s.N <= kBackwardRows;
  if (s.summaries) {  // step 7's dense part: dR_inter = Wᵀ dO
    std::fill(dri, dri + s.C * s.d, T(0));
    for (int64_t r0 = 0; r0 < s.N; r0 += kBackwardRows) {
      const int64_t rows = std::min(kBackwardRows, s.N - r0);
      affinities(aq, total_q, in.q + r0 * s.d, s_t, s, rows);
      if (!s.mix_query || one_tile) affinities(ak, total_k, in.k + r0 * s.d, s_t, s, rows);
      weight_tile(tile, s, in, aq, ak, r0, rows);
      gemm_tile<T>(dri, tile, dout + r0 * s.d, true, false, T(1), T(1), s.C, s.d, rows);
    }
  }
  clusters_backward(s, in, dout, saved, out, base, at);
  if (s.summaries) {  // Σ_tokens P·dP = Σ_tokens P (V dR_interᵀ) = R_inter · dR_inter, cluster by cluster
    T* dot = base + at.dot;
    for (int64_t c = 0; c < s.C; ++c) {
      T sum = 0;
      for (int64_t e = 0; e < s.d; ++e) sum += saved.r_inter[c * s.d + e] * dri[c * s.d + e];
      dot[c] = sum;
    }
  }
  const SlotsByToken slots(ints, in.members, s.N, s.C * s.kappa);
  for (int64_t r0 = 0; r0 < s.N; r0 += kBackwardRows)
    rows_backward(s, in, dout, saved, slots, s_t, out, base, at, r0, std::min(kBackwardRows, s.N - r0),
                  s.summaries && one_tile);
}

template <class T>
struct CastPointers {
  const T *q, *k, *v, *s, *mask, *g;
  const int32_t* members;
};

// Threads for B·H groups: never more than there are groups.
int threads_for(int64_t groups) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), groups)));
}

template <class T>
GroupSaved<T> saved_of(const CastShape& s, int64_t bh, T* r_inter, T* colsum, T* lse, T* slot_w) {
  return {r_inter ? r_inter + bh * s.C * s.d : nullptr, colsum ? colsum + bh * s.C : nullptr, lse + bh * s.C * s.kappa,
          slot_w + bh * s.C * s.kappa};
}

template <class T>
void cast_forward(const CastShape& s, const CastPointers<T>& in, T* out, const GroupSaved<T>& saved, int32_t* chosen,
                  Tensor& scratch, const Scratch& at) {
  const int64_t groups = s.B * s.H;
#pragma omp parallel num_threads(threads_for(groups))
  {
    T* base = scratch.data<T>() + omp_get_thread_num() * at.floats;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < groups; ++bh)
      group_forward(s, group_of(s, bh, in.q, in.k, in.v, in.s, in.mask, in.g, in.members), out + bh * s.N * s.d,
                    saved_of(s, bh, saved.r_inter, saved.colsum, saved.lse, saved.slot_w),
                    chosen ? chosen + bh * s.C * s.kappa : nullptr, base, at);
  }
}

// dsur_parts (B·H, C, d): each group's share, summed over the batch in order afterwards so the
// result does not depend on the number of threads.
template <class T>
void cast_backward(const CastShape& s, const CastPointers<T>& in, const T* dout, const GroupSaved<T>& saved, T* dq,
                   T* dk, T* dv, T* dg, T* dsur_parts, Tensor& scratch, Tensor& int_scratch, const Scratch& at) {
  const int64_t groups = s.B * s.H, rows = s.N * s.d;
#pragma omp parallel num_threads(threads_for(groups))
  {
    T* base = scratch.data<T>() + omp_get_thread_num() * at.floats;
    int32_t* ints = int_scratch.data<int32_t>() + omp_get_thread_num() * Scratch::ints(s);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < groups; ++bh) {
      const GroupGrads<T> grads{dq ? dq + bh * rows : nullptr, dk ? dk + bh * rows : nullptr,
                                dv ? dv + bh * rows : nullptr, dg ? dg + (bh / s.H) * s.N * s.H + bh % s.H : nullptr,
                                dsur_parts ? dsur_parts + bh * s.C * s.d : nullptr};
      group_backward(s, group_of(s, bh, in.q, in.k, in.v, in.s, in.mask, in.g, in.members), dout + bh * rows,
                     saved_of(s, bh, saved.r_inter, saved.colsum, saved.lse, saved.slot_w), grads, base, ints, at);
    }
  }
}

CastShape shape_of(const Tensor& q, const Tensor& members, const CastOptions& o) {
  return {q.dim(0), q.dim(1), q.dim(2), q.dim(3), members.dim(2), members.dim(3), o.f, o.summaries, o.mix_query};
}

struct CastAttentionFusedNode final : autograd::Node {
  Tensor g;              // input gate (B, N, H)
  Tensor q, k, v, s;     // inputs (B, H, N, d), surrogates (H, C, d)
  Tensor mask, members;  // (B, N) or undefined; (B, H, C, κ) i32
  Tensor r_inter;        // saved summaries R_inter (B, H, C, d); undefined with summaries off
  Tensor colsum;         // saved Σ_tokens A_k m (B, H, C); undefined with summaries off
  Tensor lse;            // saved row log-sum-exp of each cluster's slots (B, H, C, κ)
  Tensor slot_w;         // saved mixing weight W of each slot (B, H, C, κ)
  CastOptions options;
  const char* name() const override { return "cast_attention_fused"; }
  // The backward forms what it needs again from the inputs and what was saved; the output
  // (B, H, N, d) need not be alive beside dQ, dK and dV. (Flash attention's backward reads its
  // output for Δ = rowsum(dO ⊙ O); this one takes Σ P·dP from the probabilities it forms again.)
  bool backward_reads_outputs() const override { return false; }
  void fields(autograd::FieldVisitor& visit) const override {
    for (auto [name, t] :
         {std::pair{"g", &g}, {"q", &q}, {"k", &k}, {"v", &v}, {"s", &s}, {"mask", &mask}, {"members", &members}})
      visit.input(name, *t);
    visit.saved("r_inter", r_inter);
    visit.saved("colsum", colsum);
    visit.saved("lse", lse);
    visit.saved("slot_w", slot_w);
  }
  void backward() override;
};

void CastAttentionFusedNode::backward() {
  const CastShape sh = shape_of(q, members, options);
  auto grad = [](Tensor& t) { return t.requires_grad() ? t.grad_accumulator() : Tensor(); };
  Tensor dq = grad(q), dk = grad(k), dv = grad(v), dg = options.mix_query ? Tensor() : grad(g);
  Tensor dsur_parts = s.requires_grad() ? Tensor::empty({sh.B, sh.H, sh.C, sh.d}, q.dtype()) : Tensor();
  const Scratch at(sh, true, false);
  const int64_t threads = threads_for(sh.B * sh.H);
  Tensor scratch = Tensor::empty({threads * at.floats}, q.dtype());
  Tensor int_scratch = Tensor::empty({threads * Scratch::ints(sh)}, DType::i32);
  CAST_DISPATCH_FLOAT(q.dtype(), "cast_attention_fused", [&] {
    auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    const CastPointers<T> in{
        q.data<T>(), k.data<T>(), v.data<T>(), s.data<T>(), ptr(mask), g.data<T>(), members.data<int32_t>()};
    const GroupSaved<T> saved{ptr(r_inter), ptr(colsum), lse.data<T>(), slot_w.data<T>()};
    cast_backward<T>(sh, in, outputs[0].grad().data<T>(), saved, ptr(dq), ptr(dk), ptr(dv), ptr(dg), ptr(dsur_parts),
                     scratch, int_scratch, at);
    if (dsur_parts.defined()) {  // dS[h] += Σ_b, in batch order
      T* ds = s.grad_accumulator().data<T>();
      const T* parts = dsur_parts.data<T>();
      const int64_t per_head = sh.C * sh.d;
      for (int64_t bh = 0; bh < sh.B * sh.H; ++bh)
        for (int64_t e = 0; e < per_head; ++e) ds[(bh % sh.H) * per_head + e] += parts[bh * per_head + e];
    }
  });
}

// Both entry points: with `choosing`, members (−1 throughout) is filled by step 4 in the op.
Tensor cast_attention_fused_run(const char* op, const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& s, const Tensor& mask, Tensor members, const CastOptions& options,
                                bool choosing) {
  check_cast_attention_inputs(op, g, q, k, v, s, mask, members);
  CAST_CHECK(!q.is_cuda(), "{}: a CPU kernel, got q {}", op, q.describe());
  const CastShape sh = shape_of(q, members, options);
  Tensor out = Tensor::empty(q.shape(), q.dtype());
  Tensor r_inter = options.summaries ? Tensor::empty({sh.B, sh.H, sh.C, sh.d}, q.dtype()) : Tensor();
  Tensor colsum = options.summaries ? Tensor::empty({sh.B, sh.H, sh.C}, q.dtype()) : Tensor();
  Tensor lse = Tensor::empty({sh.B, sh.H, sh.C, sh.kappa}, q.dtype());
  Tensor slot_w = Tensor::empty({sh.B, sh.H, sh.C, sh.kappa}, q.dtype());
  {
    const Scratch at(sh, false, choosing);
    Tensor scratch = Tensor::empty({threads_for(sh.B * sh.H) * at.floats}, q.dtype());
    CAST_DISPATCH_FLOAT(q.dtype(), op, [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const CastPointers<T> in{q.data<T>(),
                               k.data<T>(),
                               v.data<T>(),
                               s.data<T>(),
                               mask.defined() ? mask.data<T>() : nullptr,
                               g.data<T>(),
                               members.data<int32_t>()};
      const GroupSaved<T> saved{ptr(r_inter), ptr(colsum), lse.data<T>(), slot_w.data<T>()};
      cast_forward<T>(sh, in, out.data<T>(), saved, choosing ? members.data<int32_t>() : nullptr, scratch, at);
    });
  }
  if (autograd::needs_grad({&g, &q, &k, &v, &s})) {
    auto node = std::make_unique<CastAttentionFusedNode>();
    node->g = g, node->q = q, node->k = k, node->v = v, node->s = s;
    node->mask = mask, node->members = members, node->r_inter = r_inter, node->colsum = colsum;
    node->lse = lse, node->slot_w = slot_w;
    node->options = options;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace

Tensor cast_attention_fused(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                            const Tensor& mask, const Tensor& members, const CastOptions& options) {
  return cast_attention_fused_run("cast_attention_fused", g, q, k, v, s, mask, members, options, false);
}

Tensor cast_attention_fused_topk(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                                 const Tensor& mask, int64_t kappa, const CastOptions& options, Tensor& members) {
  const char* op = "cast_attention_fused";
  CAST_CHECK(kappa >= 1, "{}: cluster size must be >= 1, got {}", op, kappa);
  CAST_CHECK(q.ndim() == 4 && s.ndim() == 3, "{}: q {} and surrogates {} must be [B, H, N, d] and [H, C, d]", op,
             q.describe(), s.describe());
  const int64_t slots = q.dim(0) * q.dim(1) * s.dim(1) * kappa;
  members = Tensor::from_vector<int32_t>(std::vector<int32_t>(slots, -1), {q.dim(0), q.dim(1), s.dim(1), kappa});
  return cast_attention_fused_run(op, g, q, k, v, s, mask, members, options, true);
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath cast_attention_fused_path() {
  return fast_path<CastAttentionInputs>(
      "cast_attention_fused", __FILE__, "CPU f32/f64, per-head clustering", cpu_float,
      [](const CastAttentionInputs& in) {
        if (in.members.defined())
          return cast_attention_fused(in.g, in.q, in.k, in.v, in.s, in.mask, in.members, in.options);
        Tensor chosen;
        Tensor out =
            cast_attention_fused_topk(in.g, in.q, in.k, in.v, in.s, in.mask, in.cluster_size, in.options, chosen);
        if (in.chosen) *in.chosen = chosen;
        return out;
      });
}

}  // namespace cast::ops
