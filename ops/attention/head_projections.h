#pragma once
// The attention layer's projections with the heads split or merged, each one node.
//
// The reference (nn/attention.cpp with --reference) projects with a matmul and then permutes
// (B, N, H, d) to (B, H, N, d), or permutes back before the output projection, as separate
// recorded ops: the tape then keeps both the product and its permuted copy, a second copy of
// every projection. Here the same product and permute run inside one op, whose product is a
// temporary: the tape keeps the heads only, and the backward permutes the gradient back (and,
// for the output projection, the heads again) instead of keeping them in the other layout.
// On CUDA no permuted copy is made at all: each product reads and writes one head where it lies
// in (B, H, N, d), one strided batched product per head (ops::gemm_laid_out).
#include <cstdint>

#include "tensor/tensor.h"

namespace cast::ops {

// How CUDA lays the heads out: in place (the engine's choice), or as the CPU does, one product
// of all heads and a permute. `cast bench --head-projections permuted` sets the other for one
// benchmark, so that the per-head products can be timed against the permutes they replace.
enum class HeadProjections : uint8_t { in_place, permuted };
void set_cuda_head_projections(HeadProjections way);
HeadProjections cuda_head_projections();

// x (B, N, D), w (D, H·d) -> (B, H, N, d): head h is x w[:, h·d : (h+1)·d]
Tensor project_heads(const Tensor& x, const Tensor& w, int64_t heads);
// heads (B, H, N, d), w (H·d, E) -> (B, N, E) = Σ_h heads[:, h] w[h·d : (h+1)·d, :]
Tensor merge_heads_project(const Tensor& heads, const Tensor& w);

}  // namespace cast::ops
