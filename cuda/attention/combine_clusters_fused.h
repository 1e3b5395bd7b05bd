#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// CAST step 7's sparse part fused (ops/attention/steps.h combine_clusters): no (BH, C, κ, d) tensor of
// differences or products is written. w: (BH, N, C), intra: (BH, C, κ, d), inter: (BH, C, d) or
// null (summaries off), members: (BH, C·κ) i32 (−1 = empty slot); d <= kCombineMaxHead.
//   forward:  out (BH, N, d) += Σ_{(c,p): members = i} w[i, c] (intra[c, p] − inter[c])
//   backward: dw[i, c] += dout_i · (intra[c, p] − inter[c]); dintra[c, p] += w[i, c] dout_i;
//             dinter[c] −= Σ_p w[i, c] dout_i (each gradient may be null)
constexpr int64_t kCombineMaxHead = 128;
void combine_sparse_forward(Tensor& out, const Tensor& w, const Tensor& intra, const Tensor* inter,
                            const Tensor& members);
void combine_sparse_backward(Tensor* dw, Tensor* dintra, Tensor* dinter, const Tensor& dout, const Tensor& w,
                             const Tensor& intra, const Tensor* inter, const Tensor& members);
}  // namespace cast::cuda
