// Top-k indices per row, in rank order (math/topk_order.h: larger first, NaN last, ties toward the
// lower position), exactly the CPU's. One block per row: a radix select (cuda/select.cuh) finds the
// k' = min(k, eligible) entries in O(len) and lists them in position order; then each chosen
// entry's rank among the k' is counted (O(k'²) over the block, only on the chosen few) and it is
// written at that rank. Slots past k' get −1.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/select.cuh"
#include "cuda/topk.h"
#include "math/topk_order.h"

namespace cast::cuda {

__global__ void topk_kernel(int32_t* idx, int32_t* chosen_all, const float* x, const float* mask, int64_t len,
                            int64_t group, int64_t k) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  int32_t* out = idx + r * k;
  int32_t* chosen = chosen_all + r * k;  // the selected positions, in position order
  int eligible = 0;
  block_exclusive_scan(count_eligible(mr, len), eligible);
  const int64_t take = eligible < k ? eligible : k;
  for (int64_t s = take + threadIdx.x; s < k; s += blockDim.x) out[s] = -1;
  block_select_top(chosen, xr, 1, mr, len, take);
  __syncthreads();
  for (int64_t s = threadIdx.x; s < take; s += blockDim.x) {
    const int64_t j = chosen[s];
    const float v = xr[j];
    int64_t rank = 0;
    for (int64_t t = 0; t < take; ++t)
      rank += ranks_before(xr[chosen[t]], static_cast<int64_t>(chosen[t]), v, j) ? 1 : 0;
    out[rank] = static_cast<int32_t>(j);
  }
}

void topk(Tensor& idx, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group, int64_t k) {
  if (rows == 0 || k == 0) return;
  CAST_CHECK(rows <= int64_t{INT32_MAX} && len <= int64_t{INT32_MAX},
             "topk: {} rows of {} is more than one launch takes", rows, len);
  Tensor chosen = Tensor::empty({rows, k}, DType::i32, Device::cuda);
  CAST_LAUNCH(topk_kernel, static_cast<unsigned>(rows), kThreads, 0, idx.data<int32_t>(), chosen.data<int32_t>(),
              fptr(x), mask.defined() ? fptr(mask) : nullptr, len, group, k);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
