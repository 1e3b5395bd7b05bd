// Masked mean pooling over tokens.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/pooling.h"

namespace cast::cuda {

__device__ float real_tokens(const float* mask_row, int64_t N) {
  float c = 0;
  for (int64_t n = 0; n < N; ++n) c += mask_row[n];
  return c;
}

__global__ void masked_mean_forward_kernel(float* y, const float* x, const float* mask, int64_t B, int64_t N,
                                           int64_t D) {
  CAST_KERNEL_LOOP(e, B * D) {
    const int64_t b = e / D, j = e % D;
    const float* m = mask + b * N;
    const float count = real_tokens(m, N);
    float s = 0;
    for (int64_t n = 0; n < N; ++n) s += m[n] * x[(b * N + n) * D + j];
    y[e] = count > 0.f ? s / count : 0.f;
  }
}

__global__ void masked_mean_backward_kernel(float* dx, const float* dy, const float* mask, int64_t B, int64_t N,
                                            int64_t D) {
  CAST_KERNEL_LOOP(e, B * N * D) {
    const int64_t j = e % D, n = (e / D) % N, b = e / (N * D);
    const float count = real_tokens(mask + b * N, N);
    if (count > 0.f) dx[e] += mask[b * N + n] / count * dy[b * D + j];
  }
}

void masked_mean_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t B, int64_t N, int64_t D) {
  CAST_LAUNCH(masked_mean_forward_kernel, blocks_for(B * D), kThreads, 0, fptr(y), fptr(x), fptr(mask), B, N, D);
  CUDA_CHECK_LAUNCH();
}

void masked_mean_backward(Tensor& dx, const Tensor& dy, const Tensor& mask, int64_t B, int64_t N, int64_t D) {
  CAST_LAUNCH(masked_mean_backward_kernel, blocks_for(B * N * D), kThreads, 0, fptr(dx), fptr(dy), fptr(mask), B, N, D);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
