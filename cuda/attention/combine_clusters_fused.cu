// CAST step 7's sparse part, fused (cuda/attention/combine_clusters_fused.h). Forward: one thread per (slot, column)
// adds its weighted difference into the token's output row (atomics: a token sits in several clusters). Backward: one
// block per (head, cluster), a thread per column; the block walks the cluster's κ slots, each thread keeping its
// column's share of dinter in a register and the block reducing each slot's dw over the columns. A token appears at
// most once in a cluster, so its dw[i, c] has one writer.
#include "cuda/attention/combine_clusters_fused.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace cast::cuda {

namespace {

__global__ void combine_forward_kernel(float* out, const float* w, const float* intra, const float* inter,
                                       const int32_t* members, int64_t BH, int64_t N, int64_t C, int64_t kappa,
                                       int64_t d) {
  CAST_KERNEL_LOOP(e, BH * C * kappa * d) {
    const int64_t col = e % d, slot = e / d, c = (slot / kappa) % C, bh = slot / (kappa * C);
    const int64_t i = members[slot];
    if (i < 0 || i >= N) continue;  // an empty slot (a bad id is reported by the op's check)
    const float diff = inter ? intra[e] - inter[(bh * C + c) * d + col] : intra[e];
    atomicAdd(out + (bh * N + i) * d + col, w[(bh * N + i) * C + c] * diff);
  }
}

__global__ void combine_backward_kernel(float* dw, float* dintra, float* dinter, const float* dout, const float* w,
                                        const float* intra, const float* inter, const int32_t* members, int64_t N,
                                        int64_t C, int64_t kappa, int64_t d) {
  const int64_t bh = blockIdx.x / C, c = blockIdx.x % C, col = threadIdx.x;
  const bool mine = col < d;
  const float inter_c = mine && inter ? inter[(bh * C + c) * d + col] : 0.f;
  float inter_share = 0.f;
  for (int64_t p = 0; p < kappa; ++p) {  // the same slots for the whole block: the barriers agree
    const int64_t slot = (bh * C + c) * kappa + p, i = members[slot];
    if (i < 0 || i >= N) continue;
    const float wi = w[(bh * N + i) * C + c];
    float part = 0.f;
    if (mine) {
      const float g = dout[(bh * N + i) * d + col];
      part = g * (intra[slot * d + col] - inter_c);
      if (dintra) dintra[slot * d + col] += wi * g;
      inter_share += wi * g;
    }
    part = block_reduce<false>(part);
    if (threadIdx.x == 0 && dw) dw[(bh * N + i) * C + c] += part;
  }
  if (mine && dinter) dinter[(bh * C + c) * d + col] -= inter_share;
}

}  // namespace

void combine_sparse_forward(Tensor& out, const Tensor& w, const Tensor& intra, const Tensor* inter,
                            const Tensor& members) {
  const int64_t BH = w.dim(0), N = w.dim(1), C = w.dim(2), kappa = members.dim(1) / C, d = intra.dim(-1);
  const int64_t total = BH * C * kappa * d;
  if (total == 0) return;
  CAST_LAUNCH(combine_forward_kernel, blocks_for(total), kThreads, 0, fptr(out), fptr(w), fptr(intra),
              inter ? fptr(*inter) : nullptr, members.data<int32_t>(), BH, N, C, kappa, d);
  CUDA_CHECK_LAUNCH();
}

void combine_sparse_backward(Tensor* dw, Tensor* dintra, Tensor* dinter, const Tensor& dout, const Tensor& w,
                             const Tensor& intra, const Tensor* inter, const Tensor& members) {
  const int64_t BH = w.dim(0), N = w.dim(1), C = w.dim(2), kappa = members.dim(1) / C, d = intra.dim(-1);
  CAST_CHECK(d <= kCombineMaxHead, "combine: head width {} above {}", d, kCombineMaxHead);
  if (BH * C * kappa == 0 || (!dw && !dintra && !dinter)) return;
  CAST_CHECK(BH * C <= int64_t{INT32_MAX}, "combine: {} clusters is more than one launch takes", BH * C);
  const unsigned threads = static_cast<unsigned>((d + 31) / 32 * 32);
  CAST_LAUNCH(combine_backward_kernel, static_cast<unsigned>(BH * C), threads, 0, dw ? fptr(*dw) : nullptr,
              dintra ? fptr(*dintra) : nullptr, dinter ? fptr(*dinter) : nullptr, fptr(dout), fptr(w), fptr(intra),
              inter ? fptr(*inter) : nullptr, members.data<int32_t>(), N, C, kappa, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
