#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// CAST step 6's column normalisation fused (ops/attention/steps.h cluster_summaries): one pass sums
// each cluster's column, one writes it normalised; the backward likewise, instead of the
// separate product, reduction, difference, quotient and mask passes of the step composition.
// a_k, p, dp, da_k: (BH, N, C); colsum (BH, C); mask (B, N) or null, B = BH / heads.
//   forward:  colsum = Σ_i a_k·m + 1e-30 (the CPU's summation order), p = a_k·m / colsum
//   backward: da_k += ((dp − Σ_i dp·p) / colsum) · m
void summary_weights_forward(Tensor& p, Tensor& colsum, const Tensor& a_k, const Tensor* mask, int64_t heads);
void summary_weights_backward(Tensor& da_k, const Tensor& dp, const Tensor& p, const Tensor& colsum, const Tensor* mask,
                              int64_t heads);
}  // namespace cast::cuda
