// Masked mean pooling over tokens: the real tokens of each row counted once, then one thread
// per output (forward) or per input element (backward).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/pooling.h"

namespace cast::cuda {

// Real tokens per batch row, counted once (one block per row; exact: a sum of 0s and 1s) and
// read by every element of that row afterwards.
__global__ void count_real_kernel(float* counts, const float* mask, int64_t N) {
  const float* m = mask + blockIdx.x * N;
  float c = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) c += m[n];
  c = block_reduce<false>(c);
  if (threadIdx.x == 0) counts[blockIdx.x] = c;
}

__global__ void masked_mean_forward_kernel(float* y, const float* x, const float* mask, const float* counts, int64_t B,
                                           int64_t N, int64_t D) {
  CAST_KERNEL_LOOP(e, B * D) {
    const int64_t b = e / D, j = e % D;
    const float* m = mask + b * N;
    float s = 0;
    for (int64_t n = 0; n < N; ++n) s += m[n] * x[(b * N + n) * D + j];
    y[e] = counts[b] > 0.f ? s / counts[b] : 0.f;
  }
}

__global__ void masked_mean_backward_kernel(float* dx, const float* dy, const float* mask, const float* counts,
                                            int64_t B, int64_t N, int64_t D) {
  CAST_KERNEL_LOOP(e, B * N * D) {
    const int64_t j = e % D, row = e / D, b = row / N;
    const float count = counts[b];
    if (count > 0.f) dx[e] += mask[row] / count * dy[b * D + j];
  }
}

Tensor real_counts(const Tensor& mask, int64_t B, int64_t N) {
  Tensor counts = Tensor::empty({B}, DType::f32, Device::cuda);
  CAST_LAUNCH(count_real_kernel, static_cast<unsigned>(B), kThreads, 0, fptr(counts), fptr(mask), N);
  CUDA_CHECK_LAUNCH();
  return counts;
}

void masked_mean_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t B, int64_t N, int64_t D) {
  if (B * D == 0) return;
  const Tensor counts = real_counts(mask, B, N);
  CAST_LAUNCH(masked_mean_forward_kernel, blocks_for(B * D), kThreads, 0, fptr(y), fptr(x), fptr(mask), fptr(counts), B,
              N, D);
  CUDA_CHECK_LAUNCH();
}

void masked_mean_backward(Tensor& dx, const Tensor& dy, const Tensor& mask, int64_t B, int64_t N, int64_t D) {
  if (B * N * D == 0) return;
  const Tensor counts = real_counts(mask, B, N);
  CAST_LAUNCH(masked_mean_backward_kernel, blocks_for(B * N * D), kThreads, 0, fptr(dx), fptr(dy), fptr(mask),
              fptr(counts), B, N, D);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
