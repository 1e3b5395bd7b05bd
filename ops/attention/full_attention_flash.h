#pragma once
// Full softmax attention without an M×N matrix, flash attention's algorithm, beside the
// step-by-step reference `full_attention` (ops/attention/steps.h), which it must equal. On CUDA
// tensors it runs cuda/attention/full_attention_flash.cu (f32, head width up to 128).
//
// Forward: for each tile of queries, walk the keys tile by tile with an online softmax
// (running row max m and row sum l, the output rescaled as m grows) and save only the row
// log-sum-exp L = m + log l. Backward: recompute each score tile from Q, K and L
// (P = exp(S − L)), with Δ_i = Σ_e dO_ie O_ie:
//   dV += Pᵀ dO,   dS = P ⊙ (dO Vᵀ − Δ),   dQ += dS K/√d,   dK += dSᵀ Q/√d.
// Memory: O(tile²) scratch per thread; nothing grows with M·N.
//
// Shapes: q (B, H, M, d), k and v (B, H, N, d), mask (B, N) of q's dtype (1 real, 0 padding)
// or undefined. A query whose keys are all padding outputs zeros (as the reference softmax).
#include "tensor/precision.h"
#include "tensor/tensor.h"

namespace cast::ops {

// out: (B, H, M, d); lse: (B, H, M), −∞ for a row with no real key. `precision` picks the GPU's
// kernel (tensor/precision.h, cuda/attention/full_attention_flash.h); the CPU computes in q's dtype.
void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask, Precision precision = current_precision());
// Adds into each defined gradient (dq, dk, dv may be null); `precision` as the forward's.
void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& mask, const Tensor& out, const Tensor& lse,
                              Precision precision = current_precision());

// Records one node whose saved fields are the inputs, the output and L (its backward runs at the
// forward's precision, as every node's: autograd/tape.h).
Tensor flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);

}  // namespace cast::ops
