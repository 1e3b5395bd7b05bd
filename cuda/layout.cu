// Permutation copies and strided row copies (concat, split).
#include <climits>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/layout.h"

namespace cast::cuda {

// I: the index type of the map (int32_t where every offset fits: cheaper divides).
template <class I>
__global__ void permute_kernel(float* y, const float* x, PermuteIndex idx, bool accumulate, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    const float v = x[idx.input_offset<I>(static_cast<I>(i))];
    y[i] = accumulate ? y[i] + v : v;
  }
}

__global__ void copy_rows_kernel(float* dst, const float* src, int64_t rows, int64_t row_len, int64_t dst_offset,
                                 int64_t dst_stride, int64_t src_offset, int64_t src_stride, bool accumulate) {
  CAST_KERNEL_LOOP(e, rows * row_len) {
    const int64_t r = e / row_len, j = e % row_len;
    float v = src[src_offset + r * src_stride + j];
    float* d = dst + dst_offset + r * dst_stride + j;
    *d = accumulate ? *d + v : v;
  }
}

void permute(Tensor& y, const Tensor& x, const PermuteIndex& idx, bool accumulate) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const PermuteIndex map = idx.coalesced();  // one divide per remaining dimension
  if (n < INT32_MAX)
    CAST_LAUNCH(permute_kernel<int32_t>, blocks_for(n), kThreads, 0, fptr(y), fptr(x), map, accumulate, n);
  else CAST_LAUNCH(permute_kernel<int64_t>, blocks_for(n), kThreads, 0, fptr(y), fptr(x), map, accumulate, n);
  CUDA_CHECK_LAUNCH();
}

void copy_rows(Tensor& dst, const Tensor& src, int64_t rows, int64_t row_len, int64_t dst_offset, int64_t dst_stride,
               int64_t src_offset, int64_t src_stride, bool accumulate) {
  if (rows * row_len == 0) return;
  CAST_LAUNCH(copy_rows_kernel, blocks_for(rows * row_len), kThreads, 0, fptr(dst), fptr(src), rows, row_len,
              dst_offset, dst_stride, src_offset, src_stride, accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
