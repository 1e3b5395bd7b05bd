// CAST step 6's column normalisation, fused (cuda/attention/cluster_summaries_fused.h). A column (head, cluster) is
// summed in the order of ops/reduce.h, as the step composition sums on either device: chunks of
// kSumChunk rows, then the chunk sums in order. Every chunk of every column is its own thread
// (consecutive threads take consecutive clusters: coalesced reads), so a batch of one at long N
// still fills the GPU; one thread per column then adds its chunk sums, and the elementwise pass
// has a thread per entry.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/attention/cluster_summaries_fused.h"
#include "math/sum_order.h"

namespace cast::cuda {

namespace {

// partial[(bh·chunks + k)·C + c] = Σ over rows i of chunk k of x[bh, i, c] · (y ? y[bh, i, c] : 1) · (m ? m[i] : 1)
__global__ void column_chunk_sums_kernel(float* partial, const float* x, const float* y, const float* mask, int64_t BH,
                                         int64_t N, int64_t C, int64_t chunks, int64_t heads) {
  CAST_KERNEL_LOOP(t, BH * chunks * C) {
    const int64_t c = t % C, k = (t / C) % chunks, bh = t / (C * chunks);
    const int64_t start = k * kSumChunk, end = start + kSumChunk < N ? start + kSumChunk : N;
    const float* m = mask ? mask + (bh / heads) * N : nullptr;
    float part = 0.f;
    for (int64_t i = start; i < end; ++i) {
      const int64_t at = (bh * N + i) * C + c;
      float v = y ? x[at] * y[at] : x[at];
      if (m) v *= m[i];
      part += v;
    }
    partial[t] = part;
  }
}

// total[bh·C + c] = the chunk sums of the column in order, + add.
__global__ void column_totals_kernel(float* total, const float* partial, int64_t BH, int64_t C, int64_t chunks,
                                     float add) {
  CAST_KERNEL_LOOP(col, BH * C) {
    const int64_t bh = col / C, c = col % C;
    float sum = 0.f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[(bh * chunks + k) * C + c];
    total[col] = sum + add;
  }
}

__global__ void summary_normalise_kernel(float* p, const float* colsum, const float* a_k, const float* mask, int64_t BH,
                                         int64_t N, int64_t C, int64_t heads) {
  CAST_KERNEL_LOOP(at, BH * N * C) {
    const int64_t c = at % C, i = (at / C) % N, bh = at / (N * C);
    const float w = mask ? a_k[at] * mask[(bh / heads) * N + i] : a_k[at];
    p[at] = w / colsum[bh * C + c];
  }
}

__global__ void summary_backward_kernel(float* da_k, const float* dp, const float* dot, const float* colsum,
                                        const float* mask, int64_t BH, int64_t N, int64_t C, int64_t heads) {
  CAST_KERNEL_LOOP(at, BH * N * C) {
    const int64_t c = at % C, i = (at / C) % N, bh = at / (N * C), col = bh * C + c;
    const float g = (dp[at] - dot[col]) / colsum[col];
    da_k[at] += mask ? g * mask[(bh / heads) * N + i] : g;
  }
}

// total (BH, C) = Σ_i x·y·m per column in the chunked order, + add.
void column_sums(Tensor& total, const Tensor& x, const Tensor* y, const Tensor* mask, int64_t heads, float add) {
  const int64_t BH = x.dim(0), N = x.dim(1), C = x.dim(2);
  const int64_t chunks = N > 0 ? (N + kSumChunk - 1) / kSumChunk : 0;
  Tensor partial = Tensor::empty({BH, chunks, C}, DType::f32, Device::cuda);
  if (chunks > 0) {
    CAST_LAUNCH(column_chunk_sums_kernel, blocks_for(BH * chunks * C), kThreads, 0, fptr(partial), fptr(x),
                y ? fptr(*y) : nullptr, mask ? fptr(*mask) : nullptr, BH, N, C, chunks, heads);
    CUDA_CHECK_LAUNCH();
  }
  CAST_LAUNCH(column_totals_kernel, blocks_for(BH * C), kThreads, 0, fptr(total), fptr(partial), BH, C, chunks, add);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void summary_weights_forward(Tensor& p, Tensor& colsum, const Tensor& a_k, const Tensor* mask, int64_t heads) {
  const int64_t BH = a_k.dim(0), N = a_k.dim(1), C = a_k.dim(2);
  if (BH * C == 0) return;
  column_sums(colsum, a_k, nullptr, mask, heads, 1e-30f);
  if (N == 0) return;
  CAST_LAUNCH(summary_normalise_kernel, blocks_for(BH * N * C), kThreads, 0, fptr(p), fptr(colsum), fptr(a_k),
              mask ? fptr(*mask) : nullptr, BH, N, C, heads);
  CUDA_CHECK_LAUNCH();
}

void summary_weights_backward(Tensor& da_k, const Tensor& dp, const Tensor& p, const Tensor& colsum, const Tensor* mask,
                              int64_t heads) {
  const int64_t BH = p.dim(0), N = p.dim(1), C = p.dim(2);
  if (BH * C == 0 || N == 0) return;
  Tensor dot = Tensor::empty({BH, C}, DType::f32, Device::cuda);
  column_sums(dot, dp, &p, nullptr, heads, 0.f);
  CAST_LAUNCH(summary_backward_kernel, blocks_for(BH * N * C), kThreads, 0, fptr(da_k), fptr(dp), fptr(dot),
              fptr(colsum), mask ? fptr(*mask) : nullptr, BH, N, C, heads);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
