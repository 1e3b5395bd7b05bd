#include "ops/attention/full_attention_flash.h"
#include "ops/attention/fast_paths.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "math/fast_math.h"
#include "math/softmax_rule.h"
#include "ops/matmul.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/full_attention_flash.h"
#endif

namespace cast::ops {

namespace {

// 64 queries × 128 keys: the score tile (32 KiB in f32) and the Q, K, V, O tiles of a head
// width up to 128 stay within a core's L2 cache. Where there are queries enough to keep every
// thread busy, the forward takes 256 queries at a time: each key and value tile is then packed
// for the tile kernel once per 256 queries instead of once per 64 (the score tile, 128 KiB,
// still fits the L2).
constexpr int64_t kQueryTile = 64, kKeyTile = 128, kWideQueryTile = 256;

template <class T>
struct Problem {
  const T *q, *k, *v, *mask;  // mask (B, N) or null
  int64_t B, H, M, N, d;
  T scale;
  const T* q_rows(int64_t bh, int64_t i0) const { return q + (bh * M + i0) * d; }
  const T* k_rows(int64_t bh, int64_t j0) const { return k + (bh * N + j0) * d; }
  const T* v_rows(int64_t bh, int64_t j0) const { return v + (bh * N + j0) * d; }
  const T* key_mask(int64_t bh, int64_t j0) const { return mask ? mask + (bh / H) * N + j0 : nullptr; }
};

template <class T>
Problem<T> problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  return {q.data<T>(), k.data<T>(),
          v.data<T>(), mask.defined() ? mask.data<T>() : nullptr,
          q.dim(0),    q.dim(1),
          q.dim(2),    k.dim(2),
          q.dim(3),    static_cast<T>(1.0 / std::sqrt(static_cast<double>(q.dim(3))))};
}

// Scores of padded keys become −∞, so the softmax loops need no test per element.
template <class T>
void mask_columns(T* scores, const T* key_mask, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    if (key_mask[c] == T(0))
      for (int64_t r = 0; r < rows; ++r) scores[r * cols + c] = softmax_rule::masked<T>();
}

// dS of padded keys is 0, as the reference softmax's backward skips them: P = 0 there, but
// 0 · (dP − Δ) would be NaN in a row whose Δ is NaN (math/fast_math.h: the NaN rule).
template <class T>
void zero_masked_columns(T* ds, const T* key_mask, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c)
    if (key_mask[c] == T(0))
      for (int64_t r = 0; r < rows; ++r) ds[r * cols + c] = T(0);
}

// ---------------------------------------------------------------- forward
// A thread's tiles, allocated once per call
template <class T>
struct ForwardScratch {
  std::vector<T> scores, acc, row_max, row_sum;
  TileOperand<T> keys, values;  // op(b) of S = Q Kᵀ and of O += P V, packed once per key tile
  ForwardScratch(int64_t query_tile, int64_t d)
      : scores(query_tile * kKeyTile), acc(query_tile * d), row_max(query_tile), row_sum(query_tile) {}
};

// One tile of nq queries against all keys: the online softmax.
template <class T>
void forward_tile(const Problem<T>& p, int64_t bh, int64_t i0, int64_t nq, T* out, T* lse, ForwardScratch<T>& w) {
  const int64_t d = p.d;
  T *scores = w.scores.data(), *acc = w.acc.data(), *row_max = w.row_max.data(), *row_sum = w.row_sum.data();
  std::fill(acc, acc + nq * d, T(0));
  std::fill(row_max, row_max + nq, softmax_rule::masked<T>());
  std::fill(row_sum, row_sum + nq, T(0));
  for (int64_t j0 = 0; j0 < p.N; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, p.N - j0);
    const T* mk = p.key_mask(bh, j0);
    w.keys.set(p.k_rows(bh, j0), true, nk, d);
    w.keys.multiply(scores, p.q_rows(bh, i0), false, p.scale, T(0), nq);  // S = Q Kᵀ/√d
    if (mk) mask_columns(scores, mk, nq, nk);
    for (int64_t r = 0; r < nq; ++r) {
      T* s = scores + r * nk;
      const T tile_max = max_of(s, nk);
      const T new_max = std::max(row_max[r], tile_max);
      if (new_max == softmax_rule::masked<T>()) {  // no real key yet: nothing to add, unless NaN came in
        bool nan = false;
        for (int64_t c = 0; c < nk; ++c) nan = nan || std::isnan(s[c]);
        if (nan) row_sum[r] = std::numeric_limits<T>::quiet_NaN();  // NaN propagates to the output
        std::fill(s, s + nk, T(0));
        continue;
      }
      const T total = softmax_rule::weigh_row(s, nk, new_max);  // a masked −∞ gives 0
      // rescale what was accumulated under the old maximum (exp(−∞) = 0 on the first tile)
      const T rescale = softmax_rule::rescale(row_max[r], new_max);
      row_sum[r] = row_sum[r] * rescale + total;
      row_max[r] = new_max;
      T* a = acc + r * d;
#pragma omp simd
      for (int64_t e = 0; e < d; ++e) a[e] *= rescale;
    }
    w.values.set(p.v_rows(bh, j0), false, d, nk);
    w.values.multiply(acc, scores, false, T(1), T(1), nq);  // O += P V
  }
  for (int64_t r = 0; r < nq; ++r) {
    const T inv = softmax_rule::inverse_sum(row_sum[r]);
    for (int64_t e = 0; e < d; ++e) out[r * d + e] = acc[r * d + e] * inv;
    lse[r] = softmax_rule::log_sum_exp(row_max[r], row_sum[r]);
  }
}

template <class T>
void forward_cpu(const Problem<T>& p, T* out, T* lse) {
  auto tiles_of = [&](int64_t tile) { return (p.M + tile - 1) / tile; };
  const int64_t query_tile =
      p.B * p.H * tiles_of(kWideQueryTile) >= 2 * omp_get_max_threads() ? kWideQueryTile : kQueryTile;
  const int64_t tiles = tiles_of(query_tile), tasks = p.B * p.H * tiles;
#pragma omp parallel if (tasks > 1)
  {
    ForwardScratch<T> scratch(query_tile, p.d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / tiles, i0 = (task % tiles) * query_tile, nq = std::min(query_tile, p.M - i0);
      forward_tile(p, bh, i0, nq, out + (bh * p.M + i0) * p.d, lse + bh * p.M + i0, scratch);
    }
  }
}

// ---------------------------------------------------------------- backward
template <class T>
struct Grads {
  T *dq, *dk, *dv;      // null when not wanted
  const T *dout, *out;  // (B, H, M, d)
  const T* lse;         // (B, H, M)
  const T* delta;       // Δ: (B, H, M)
};

// The keys [j_begin, j_end) of head bh against every query. dK and dV of these keys are owned
// by this call; dQ goes to dq_rows (the gradient itself, or this split's partial sum).
template <class T>
struct BackwardScratch {
  std::vector<T> probs, dprobs, dk_tile, dv_tile;
  // the key tile's operands, packed once for every query tile: Kᵀ of S, Vᵀ of dP, K of dQ
  TileOperand<T> keys_t, values_t, keys;
  explicit BackwardScratch(int64_t d)
      : probs(kQueryTile * kKeyTile), dprobs(kQueryTile * kKeyTile), dk_tile(kKeyTile * d), dv_tile(kKeyTile * d) {}
};

template <class T>
void backward_keys(const Problem<T>& p, const Grads<T>& g, int64_t bh, int64_t j_begin, int64_t j_end, T* dq_rows,
                   BackwardScratch<T>& w) {
  const int64_t d = p.d;
  T *probs = w.probs.data(), *dprobs = w.dprobs.data(), *dk_tile = w.dk_tile.data(), *dv_tile = w.dv_tile.data();
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyTile) {
    const int64_t nk = std::min(kKeyTile, j_end - j0);
    const T* mk = p.key_mask(bh, j0);
    const T *kj = p.k_rows(bh, j0), *vj = p.v_rows(bh, j0);
    w.keys_t.set(kj, true, nk, d);
    if (g.dq || g.dk) w.values_t.set(vj, true, nk, d);
    if (g.dq) w.keys.set(kj, false, d, nk);
    std::fill(dk_tile, dk_tile + nk * d, T(0));
    std::fill(dv_tile, dv_tile + nk * d, T(0));
    for (int64_t i0 = 0; i0 < p.M; i0 += kQueryTile) {
      const int64_t nq = std::min(kQueryTile, p.M - i0);
      const T *qi = p.q_rows(bh, i0), *doi = g.dout + (bh * p.M + i0) * d;
      const T *lse = g.lse + bh * p.M + i0, *delta = g.delta + bh * p.M + i0;
      w.keys_t.multiply(probs, qi, false, p.scale, T(0), nq);  // S = Q Kᵀ/√d
      if (mk) mask_columns(probs, mk, nq, nk);
      for (int64_t r = 0; r < nq; ++r) {  // P = exp(S − L); a row with no real key has L = −∞ and P = 0
        T* s = probs + r * nk;
#pragma omp simd
        for (int64_t c = 0; c < nk; ++c)
          s[c] = softmax_rule::probability(s[c], s[c] != softmax_rule::masked<T>(), lse[r]);
      }
      if (g.dv) gemm_tile<T>(dv_tile, probs, doi, true, false, T(1), T(1), nk, d, nq);  // dV += Pᵀ dO
      if (!g.dq && !g.dk) continue;
      w.values_t.multiply(dprobs, doi, false, T(1), T(0), nq);  // dP = dO Vᵀ
      for (int64_t r = 0; r < nq; ++r) {                        // dS = P ⊙ (dP − Δ)
        T* ds = dprobs + r * nk;
        const T* s = probs + r * nk;
#pragma omp simd
        for (int64_t c = 0; c < nk; ++c) ds[c] = softmax_rule::score_gradient(s[c], ds[c], delta[r]);
      }
      if (mk) zero_masked_columns(dprobs, mk, nq, nk);
      if (g.dq) w.keys.multiply(dq_rows + i0 * d, dprobs, false, p.scale, T(1), nq);       // dQ += dS K/√d
      if (g.dk) gemm_tile<T>(dk_tile, dprobs, qi, true, false, p.scale, T(1), nk, d, nq);  // dK += dSᵀ Q/√d
    }
    const int64_t base = (bh * p.N + j0) * d;
    if (g.dk)
      for (int64_t e = 0; e < nk * d; ++e) g.dk[base + e] += dk_tile[e];
    if (g.dv)
      for (int64_t e = 0; e < nk * d; ++e) g.dv[base + e] += dv_tile[e];
  }
}

// Δ of query row r (= bh·M + i) as the reference's softmax backward forms it: Σ_j P_ij dP_ij over
// the real keys only. dO_i · O_i equals it unless a padded key's value is NaN or infinite:
// P = 0 there, yet 0 · NaN makes O_i NaN (as in the reference's output) but must not reach Δ.
template <class T>
T delta_over_real_keys(const Problem<T>& p, const Grads<T>& g, int64_t r) {
  const int64_t bh = r / p.M, i = r % p.M, d = p.d;
  const T* qi = p.q_rows(bh, i);
  const T* doi = g.dout + r * d;
  const T* mk = p.key_mask(bh, 0);
  T delta = 0;
  for (int64_t j = 0; j < p.N; ++j) {
    if (mk && mk[j] == T(0)) continue;
    const T *kj = p.k_rows(bh, j), *vj = p.v_rows(bh, j);
    T s = 0, dp = 0;
    for (int64_t e = 0; e < d; ++e) s += qi[e] * kj[e], dp += doi[e] * vj[e];
    delta += softmax_rule::probability(s * p.scale, true, g.lse[r]) * dp;
  }
  return delta;
}

template <class T>
void backward_cpu(const Problem<T>& p, Grads<T> g) {
  const int64_t BH = p.B * p.H, d = p.d;
  if (BH == 0) return;  // no (batch, head) pair: no gradient element to write
  // Δ_i = dO_i · O_i, and the sum over real keys where that is not finite (rare: no cost else)
  std::vector<T> delta(BH * p.M);
#pragma omp parallel for if (BH * p.M * d > 65536)
  for (int64_t r = 0; r < BH * p.M; ++r) {
    T s = 0;
    for (int64_t e = 0; e < d; ++e) s += g.dout[r * d + e] * g.out[r * d + e];
    delta[r] = std::isfinite(s) ? s : delta_over_real_keys(p, g, r);
  }
  g.delta = delta.data();
  // Tasks own whole key ranges, so dK and dV need no locks. With fewer heads than threads the
  // keys of a head are split, and each split sums its dQ apart; the sums are added at the end.
  const int64_t key_tiles = (p.N + kKeyTile - 1) / kKeyTile;
  const int64_t threads = omp_get_max_threads();
  const int64_t splits = std::clamp<int64_t>((threads + BH - 1) / BH, 1, std::max<int64_t>(key_tiles, 1));
  const int64_t tiles_per_split = (key_tiles + splits - 1) / splits;
  std::vector<T> partial;
  if (g.dq && splits > 1) partial.assign(splits * BH * p.M * d, T(0));
  const int64_t tasks = BH * splits;
#pragma omp parallel if (tasks > 1)
  {
    BackwardScratch<T> scratch(d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bh = task / splits, split = task % splits;
      const int64_t j_begin = std::min(p.N, split * tiles_per_split * kKeyTile);
      const int64_t j_end = std::min(p.N, (split + 1) * tiles_per_split * kKeyTile);
      T* dq_rows = !g.dq ? nullptr : splits > 1 ? partial.data() + (split * BH + bh) * p.M * d : g.dq + bh * p.M * d;
      backward_keys(p, g, bh, j_begin, j_end, dq_rows, scratch);
    }
  }
  if (!partial.empty()) {
    const int64_t n = BH * p.M * d;
#pragma omp parallel for if (n > 65536)
    for (int64_t e = 0; e < n; ++e)
      for (int64_t s = 0; s < splits; ++s) g.dq[e] += partial[s * n + e];
  }
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  const char* op = "flash_attention";
  check_float(op, q, "q");
  check_ndim(op, q, 4, "q");
  check_ndim(op, k, 4, "k");
  check_same_dtype(op, q, k);
  check_same_shape(op, k, v);
  CAST_CHECK(q.dim(0) == k.dim(0) && q.dim(1) == k.dim(1) && q.dim(3) == k.dim(3),
             "flash_attention: q {} and k {} must share batch, heads and width", q.describe(), k.describe());
  check_same_device(op, q, k);
  check_same_device(op, k, v);
  if (mask.defined()) {
    check_same_dtype(op, q, mask);
    check_same_device(op, q, mask);  // a host mask handed to a GPU kernel would fault there
    CAST_CHECK(mask.shape() == (Shape{k.dim(0), k.dim(2)}), "flash_attention: mask {} must be [{}, {}]",
               mask.describe(), k.dim(0), k.dim(2));
  }
}

}  // namespace

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask, Precision precision) {
  check_inputs(q, k, v, mask);
  CAST_ON_CUDA(q, cuda::flash_attention_forward(out, lse, q, k, v, mask, cuda::flash_kernel_for(precision)));
  CAST_DISPATCH_FLOAT(q.dtype(), "flash_attention",
                      [&] { forward_cpu(problem<T>(q, k, v, mask), out.data<T>(), lse.data<T>()); });
}

void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& mask, const Tensor& out, const Tensor& lse,
                              Precision precision) {
  check_inputs(q, k, v, mask);
  CAST_ON_CUDA(
      q, cuda::flash_attention_backward(dq, dk, dv, dout, q, k, v, mask, out, lse, cuda::flash_kernel_for(precision)));
  CAST_DISPATCH_FLOAT(q.dtype(), "flash_attention", [&] {
    Grads<T> g{dq ? dq->data<T>() : nullptr,
               dk ? dk->data<T>() : nullptr,
               dv ? dv->data<T>() : nullptr,
               dout.data<T>(),
               out.data<T>(),
               lse.data<T>(),
               nullptr};
    backward_cpu(problem<T>(q, k, v, mask), g);
  });
}

struct FlashAttentionNode final : autograd::Node {
  Tensor q, k, v;  // inputs (B, H, M|N, d)
  Tensor mask;     // (B, N) or undefined
  Tensor out;      // saved output O, for Δ
  Tensor lse;      // saved row log-sum-exp L: (B, H, M)
  const char* name() const override { return "flash_attention"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("mask", mask);
    visit.saved("out", out);
    visit.saved("lse", lse);
  }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    flash_attention_backward(dq.defined() ? &dq : nullptr, dk.defined() ? &dk : nullptr, dv.defined() ? &dv : nullptr,
                             out.grad(), q, k, v, mask, out, lse);  // at the forward's precision (the tape's)
  }
};

Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  check_inputs(q, k, v, mask);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({q.dim(0), q.dim(1), q.dim(2)}, q.dtype(), q.device());
  flash_attention_forward(out, lse, q, k, v, mask);
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<FlashAttentionNode>();
    node->q = q, node->k = k, node->v = v, node->mask = mask, node->out = out, node->lse = lse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- its row of the fast-path table
// The CUDA flash kernels are compiled for head widths up to 128 (cuda/attention/full_attention_flash.cu).
static bool flash_fits(const StepSizes& s) { return cpu_float(s) || (cuda_f32(s) && s.head_width <= 128); }

FastPath flash_attention_path() {
  return fast_path<FullAttentionInputs>(
      "flash_attention", __FILE__, "CPU f32/f64; CUDA f32 with head width up to 128", flash_fits,
      [](const FullAttentionInputs& in) { return flash_attention(in.q, in.k, in.v, in.mask); });
}

}  // namespace cast::ops
