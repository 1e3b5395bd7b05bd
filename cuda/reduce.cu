// Sum over one axis of a tensor viewed as (outer, n, inner).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/reduce.h"

namespace cast::cuda {

// inner > 1: one thread per output, reading down the axis (coalesced across threads).
__global__ void sum_strided_kernel(float* y, const float* x, int64_t outer, int64_t n, int64_t inner, float scale) {
  CAST_KERNEL_LOOP(o, outer * inner) {
    const int64_t a = o / inner, i = o % inner;
    float s = 0;
    for (int64_t j = 0; j < n; ++j) s += x[(a * n + j) * inner + i];
    y[o] = s * scale;
  }
}

// inner == 1: one block per output, reducing a contiguous row.
__global__ void sum_rows_kernel(float* y, const float* x, int64_t n, float scale) {
  const float* row = x + blockIdx.x * n;
  float s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) y[blockIdx.x] = s * scale;
}

__global__ void sum_backward_kernel(float* dx, const float* dy, int64_t outer, int64_t n, int64_t inner,
                                    float scale) {
  CAST_KERNEL_LOOP(e, outer * n * inner) {
    const int64_t i = e % inner, a = e / (n * inner);
    dx[e] += scale * dy[a * inner + i];
  }
}

void sum_axis_forward(Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double scale) {
  if (outer * inner == 0) return;  // nothing to write (and a 0-block launch is an error)
  if (inner == 1 && outer <= 2147483647) {
    CAST_LAUNCH(sum_rows_kernel, static_cast<unsigned>(outer), kThreads, 0, fptr(y), fptr(x), n, static_cast<float>(scale));
  } else {
    CAST_LAUNCH(sum_strided_kernel, blocks_for(outer * inner), kThreads, 0, fptr(y), fptr(x), outer, n, inner,
                                                               static_cast<float>(scale));
  }
  CUDA_CHECK_LAUNCH();
}

void sum_axis_backward(Tensor& dx, const Tensor& dy, int64_t outer, int64_t n, int64_t inner, double scale) {
  if (outer * n * inner == 0) return;
  CAST_LAUNCH(sum_backward_kernel, blocks_for(outer * n * inner), kThreads, 0, fptr(dx), fptr(dy), outer, n, inner,
                                                                   static_cast<float>(scale));
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
