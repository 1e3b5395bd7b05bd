#pragma once
// Shared helpers for the kernels: launch sizes and block-wide reductions.
#include <cstdint>

#include "cuda/check.h"
#include "cuda/shared_memory.cuh"
#include "tensor/tensor.h"

namespace cast::cuda {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

// Grid-stride loop: correct for any n whatever the grid size.
#define CAST_KERNEL_LOOP(i, n)                                                           \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the whole block; every thread receives the result. blockDim.x % 32 == 0.
template <bool IsMax>
__device__ float block_reduce(float v) {
  CAST_SHARED_ARRAY(float, partial, 32);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = IsMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial[] may still be read from a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float r = lane < warps ? partial[lane] : (IsMax ? -INFINITY : 0.0f);
  return IsMax ? warp_max(r) : warp_sum(r);
}

inline float* fptr(Tensor& t) { return t.data<float>(); }
inline const float* fptr(const Tensor& t) { return t.data<float>(); }

}  // namespace cast::cuda
