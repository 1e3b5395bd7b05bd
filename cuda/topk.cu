// Top-k indices per row by ranking: an eligible element's rank is the number of eligible
// elements ahead of it in the order of ops/topk_order.h (NaN last, ties by position); rank < k
// is written at its rank. Deterministic and exactly the CPU order. O(len²) per row: fine for the
// sizes used here; a faster selection belongs to the performance work.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/topk.h"
#include "ops/topk_order.h"

namespace cast::cuda {

__global__ void topk_kernel(int32_t* idx, const float* x, const float* mask, int64_t len, int64_t group, int64_t k) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  int32_t* out = idx + r * k;
  float eligible = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) eligible += (!mr || mr[j] != 0.f) ? 1.f : 0.f;
  const int64_t count = static_cast<int64_t>(block_reduce<false>(eligible));
  for (int64_t s = count + threadIdx.x; s < k; s += blockDim.x) out[s] = -1;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    if (mr && mr[j] == 0.f) continue;
    const float v = xr[j];
    int64_t rank = 0;
    for (int64_t i = 0; i < len && rank < k; ++i) {
      if (mr && mr[i] == 0.f) continue;
      rank += ranks_before(xr[i], i, v, j) ? 1 : 0;
    }
    if (rank < k) out[rank] = static_cast<int32_t>(j);
  }
}

void topk(Tensor& idx, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group, int64_t k) {
  if (rows == 0 || k == 0) return;
  CAST_LAUNCH(topk_kernel, static_cast<unsigned>(rows), kThreads, 0, idx.data<int32_t>(), fptr(x),
                                                        mask.defined() ? fptr(mask) : nullptr, len, group, k);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
