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

// Blocks that add to one buffer in turn (block x after block x − 1), so that its sums come out
// the same at every run: the one thread that waits spins on a flag in global memory, and the
// block's writes, made with load_coherent and store_coherent (through L2, where every SM sees
// them), are fenced before pass_turn hands the flag on. A block waits only for a block of a
// lower index. CUDA does not promise that blocks start in index order; the wait ends because
// GPUs do start them so (an assumption FlashAttention-3's deterministic backward makes too), and
// the waiter backs off between reads so that it takes few issue slots from the block it waits
// for. The emulation runs blocks in order, so a turn that has not come never will: it says so
// instead of spinning.
__device__ __forceinline__ void wait_turn(const int* flag, int turn) {
#if defined(CAST_CUDA_EMULATION)
  CAST_CHECK(*flag == turn, "CUDA emulation: a block waits for turn {} of a flag that holds {}, and blocks run in order",
             turn, *flag);
#else
  int now;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(now) : "l"(flag) : "memory");
    if (now == turn) break;
    __nanosleep(64);
  }
#endif
}
__device__ __forceinline__ void pass_turn(int* flag, int next) {
#if defined(CAST_CUDA_EMULATION)
  *flag = next;
#else
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(next) : "memory");
#endif
}
__device__ __forceinline__ float load_coherent(const float* p) {
#if defined(CAST_CUDA_EMULATION)
  return *p;
#else
  return __ldcg(p);
#endif
}
__device__ __forceinline__ void store_coherent(float* p, float v) {
#if defined(CAST_CUDA_EMULATION)
  *p = v;
#else
  __stcg(p, v);
#endif
}

inline float* fptr(Tensor& t) { return t.data<float>(); }
inline const float* fptr(const Tensor& t) { return t.data<float>(); }

}  // namespace cast::cuda
