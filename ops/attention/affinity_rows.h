#pragma once
// Rows of CAST's affinities (steps 1–2) that the fused CPU kernels share
// (ops/attention/cluster_affinities_fused.cpp, ops/attention/cast_attention_fused.cpp): the Laplace row as the
// reference forms it, and its score gradient. The softmax rows are ops/softmax.h's.
#include <cstdint>

#include "ops/unary_cpu.h"

namespace cast::ops::affinity_rows {

// u = f(x), A = u / (Σ u + 1e-30) in place; returns Σ u + 1e-30, what the backward divides by.
template <class T>
T laplace_row(T* row, int64_t C) {
  T total = 0;
  for (int64_t c = 0; c < C; ++c) {
    row[c] = unary_cpu::apply_cpu<UnaryOp::laplace, T>(row[c]);
    total += row[c];
  }
  total += static_cast<T>(1e-30);
  for (int64_t c = 0; c < C; ++c) row[c] /= total;
  return total;
}

// The score gradient of one Laplace row, f'(x) (dA − Σ A·dA) / total, written over the row's
// recomputed scores x. `ds` may be `da`'s row: each element is read before it is written.
template <class T>
void laplace_gradient_row(T* ds, const T* da, const T* a, T total, int64_t C) {
  T dot = 0;
  for (int64_t c = 0; c < C; ++c) dot += da[c] * a[c];
  for (int64_t c = 0; c < C; ++c)
    ds[c] = (da[c] - dot) / total * unary_cpu::derivative_cpu<UnaryOp::laplace, T>(ds[c], T(0));
}

}  // namespace cast::ops::affinity_rows
