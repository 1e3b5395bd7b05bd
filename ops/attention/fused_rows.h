#pragma once
// Row helpers of the fused CPU attention kernels (ops/attention/intra_cluster_attention_fused.cpp,
// ops/attention/improved_clustered_output_fused.cpp): gathers and scatters of token rows by id, and the masked
// softmax of a score tile with its log-sum-exp, its recomputation from the log-sum-exp and its
// gradient. The rule for empty and NaN rows is math/fast_math.h's, as in the reference softmax.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "math/fast_math.h"
#include "math/softmax_rule.h"
#include "tensor/tensor.h"

namespace cast::ops::fused_rows {

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

// Softmax of each row of s (rows, cols) over the columns whose id is ≥ 0, in place; lse[r]
// gets the row's log-sum-exp (−∞ and a zero row when no column is valid).
template <class T>
void softmax_rows(T* s, const int32_t* col_ids, int64_t rows, int64_t cols, T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * cols;
    for (int64_t c = 0; c < cols; ++c)
      if (col_ids[c] < 0) row[c] = softmax_rule::masked<T>();
    const T mx = max_of(row, cols);
    if (mx == softmax_rule::masked<T>()) {  // no valid column, or only NaN: NaN must stay NaN
      bool nan = false;
      for (int64_t c = 0; c < cols; ++c) nan = nan || std::isnan(row[c]);
      std::fill(row, row + cols, softmax_rule::empty_row<T>(nan));
      lse[r] = nan ? softmax_rule::empty_row<T>(true) : softmax_rule::masked<T>();
      continue;
    }
    const T total = softmax_rule::weigh_row(row, cols, mx);
    lse[r] = softmax_rule::log_sum_exp(mx, total);
    const T inv = T(1) / total;  // NaN in a row holding a NaN: its empty slots stay 0 (math/fast_math.h)
    for (int64_t c = 0; c < cols; ++c) row[c] = col_ids[c] < 0 ? T(0) : row[c] * inv;
  }
}

// P = exp(S − lse) in place from recomputed scores, 0 in invalid columns and empty rows.
template <class T>
void probabilities_from_lse(T* s, const int32_t* col_ids, int64_t rows, int64_t cols, const T* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = s + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = softmax_rule::probability(row[c], col_ids[c] >= 0, lse[r]);
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
    for (int64_t c = 0; c < cols; ++c) g[c] = softmax_rule::score_gradient(pr[c], g[c], dot);
  }
}

}  // namespace cast::ops::fused_rows
