#pragma once
// The masked-row softmax rule, written once for every softmax of the engine: the reference
// softmax (ops/softmax.cpp, cuda/softmax.cu), the fused CPU kernels (ops/attention/full_attention_flash.cpp,
// ops/attention/fused_rows.h) and the CUDA kernels (cuda/attention/full_attention_flash.cu,
// cuda/attention/improved_clustered_output_topkey.cu). Both compilers read it: under nvcc `exp` is expf, elsewhere (the
// CPU, and the emulated kernels) the vectorisable exp_nonpositive of math/fast_math.h (f64: std::exp in both).
//
// A row's scores s_j, some masked (−∞: padding keys, empty slots):
//   two passes   m = max_j s_j, P_j = weight(s_j, m) / Σ weight
//   online       m and l = Σ weight run over blocks of the row; when m grows, what was summed
//                so far is multiplied by rescale(m_old, m_new); L = log_sum_exp(m, l)
//   recomputed   P_j = probability(s_j, real_j, L)
//   backward     dS_j = score_gradient(P_j, dP_j, Δ), Δ = Σ_j P_j dP_j (= dO · O)
// A row without a real score (m = −∞, l = 0) gives P = 0 and L = −∞ (empty_row for the two-pass
// forms, whose max cannot tell a masked row from a row of NaN). NaN is never hidden: exp of NaN
// is NaN, so a NaN among a row's real scores makes its sum and every probability of the row
// NaN, while a masked score keeps probability 0 whatever the row holds (math/fast_math.h).
#include <cmath>
#include <cstdint>

#include "tensor/hd.h"
#if !defined(__CUDACC__)
#include "math/fast_math.h"
#endif

namespace cast::softmax_rule {

template <class T>
CAST_HD T masked() {
  return -static_cast<T>(INFINITY);
}

// exp(x) for x ≤ 0 (scores minus their row's maximum or log-sum-exp, ≤ 0 but for rounding).
#if defined(__CUDACC__)
CAST_HD float exp(float x) { return expf(x); }
CAST_HD double exp(double x) { return ::exp(x); }
#else
template <class T>
inline T exp(T x) {
  return ops::exp_nonpositive(ops::at_most_zero(x));
}
#endif
CAST_HD float log(float x) { return ::logf(x); }
CAST_HD double log(double x) { return ::log(x); }

// A score's weight under its row's maximum m: 0 for a masked score.
template <class T>
CAST_HD T weight(T s, T m) {
  const T e = exp(s - m);  // computed either way: the CPU's loops stay a vector select
  return s == masked<T>() ? T(0) : e;
}

// What a row summed under its old maximum is multiplied by when the maximum grows to m_new:
// 1 while the row has no real score yet (−∞ − −∞ would be NaN).
template <class T>
CAST_HD T rescale(T m_old, T m_new) {
  return m_new == masked<T>() ? T(1) : exp(m_old - m_new);
}

// The row's log-sum-exp L from its maximum and its sum of weights; −∞ for a row with no real score.
template <class T>
CAST_HD T log_sum_exp(T m, T sum) {
  return sum == T(0) ? masked<T>() : m + log(sum);
}

// What normalises the row's output (1 / its sum of weights); 0 for a row with no real score.
template <class T>
CAST_HD T inverse_sum(T sum) {
  return sum == T(0) ? T(0) : T(1) / sum;
}

// A probability recomputed from the row's log-sum-exp: 0 for a masked score and in a row with
// no real score.
template <class T>
CAST_HD T probability(T s, bool real, T lse) {
  return real && lse != masked<T>() ? exp(s - lse) : T(0);
}

// The softmax's backward for one score: dS = P (dP − Δ).
template <class T>
CAST_HD T score_gradient(T p, T dp, T delta) {
  return p * (dp - delta);
}

// Every entry of a row whose maximum is −∞: NaN when one of its real scores was NaN, else 0.
template <class T>
CAST_HD T empty_row(bool any_nan) {
  return any_nan ? static_cast<T>(NAN) : T(0);
}

#if !defined(__CUDACC__)
// The CPU's row form: s = weight(s, shift) in place; returns Σ s.
template <class T>
T weigh_row(T* __restrict s, int64_t n, T shift) {
  T total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t c = 0; c < n; ++c) {
    s[c] = weight(s[c], shift);
    total += s[c];
  }
  return total;
}
#endif

}  // namespace cast::softmax_rule
