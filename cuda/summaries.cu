// CAST step 6's column normalisation, fused (cuda/summaries.h). One thread per (head, cluster)
// column walks its N entries (consecutive threads read consecutive clusters: coalesced). Sums run
// in the order of ops/reduce.h (chunks of kSumChunk rows, then the chunk sums), as the step
// composition sums on either device.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/summaries.h"
#include "ops/reduce.h"

namespace cast::cuda {

namespace {

// Σ_i f(i) over i < n in the chunked order of ops/reduce.h.
template <class F>
__device__ float chunked_sum(int64_t n, F f) {
  float total = 0.f;
  for (int64_t start = 0; start < n; start += ops::kSumChunk) {
    const int64_t end = start + ops::kSumChunk < n ? start + ops::kSumChunk : n;
    float part = 0.f;
    for (int64_t i = start; i < end; ++i) part += f(i);
    total = n > ops::kSumChunk ? total + part : part;
  }
  return total;
}

__global__ void summary_forward_kernel(float* p, float* colsum, const float* a_k, const float* mask, int64_t BH,
                                       int64_t N, int64_t C, int64_t heads) {
  CAST_KERNEL_LOOP(col, BH * C) {
    const int64_t bh = col / C, c = col % C;
    const float* a = a_k + bh * N * C + c;  // entry i at a[i * C]
    const float* m = mask ? mask + (bh / heads) * N : nullptr;
    auto w = [&](int64_t i) { return m ? a[i * C] * m[i] : a[i * C]; };
    const float total = chunked_sum(N, w) + 1e-30f;
    colsum[col] = total;
    for (int64_t i = 0; i < N; ++i) p[bh * N * C + i * C + c] = w(i) / total;
  }
}

__global__ void summary_backward_kernel(float* da_k, const float* dp, const float* p, const float* colsum,
                                        const float* mask, int64_t BH, int64_t N, int64_t C, int64_t heads) {
  CAST_KERNEL_LOOP(col, BH * C) {
    const int64_t bh = col / C, c = col % C, base = bh * N * C + c;
    const float* m = mask ? mask + (bh / heads) * N : nullptr;
    const float dot = chunked_sum(N, [&](int64_t i) { return dp[base + i * C] * p[base + i * C]; });
    for (int64_t i = 0; i < N; ++i) {
      const float g = (dp[base + i * C] - dot) / colsum[col];
      da_k[base + i * C] += m ? g * m[i] : g;
    }
  }
}

}  // namespace

void summary_weights_forward(Tensor& p, Tensor& colsum, const Tensor& a_k, const Tensor* mask, int64_t heads) {
  const int64_t BH = a_k.dim(0), N = a_k.dim(1), C = a_k.dim(2);
  if (BH * C == 0) return;
  CAST_LAUNCH(summary_forward_kernel, blocks_for(BH * C), kThreads, 0, fptr(p), fptr(colsum), fptr(a_k),
              mask ? fptr(*mask) : nullptr, BH, N, C, heads);
  CUDA_CHECK_LAUNCH();
}

void summary_weights_backward(Tensor& da_k, const Tensor& dp, const Tensor& p, const Tensor& colsum, const Tensor* mask,
                              int64_t heads) {
  const int64_t BH = p.dim(0), N = p.dim(1), C = p.dim(2);
  if (BH * C == 0) return;
  CAST_LAUNCH(summary_backward_kernel, blocks_for(BH * C), kThreads, 0, fptr(da_k), fptr(dp), fptr(p), fptr(colsum),
              mask ? fptr(*mask) : nullptr, BH, N, C, heads);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
