// Permutation copies and strided row copies (concat, split).
#include <climits>
#include <cstdint>

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

// The same copy four floats at a time, where the innermost output dimension is contiguous in the
// input and every run of four stays together: `map` counts in float4 units. The heads' split and
// merge, (B, N, H, d) <-> (B, H, N, d), move whole rows of d floats; element by element they ran at
// a third of the memory's bandwidth on an H100 (bench/RESULTS.md).
__global__ void permute4_kernel(float4* y, const float4* x, PermuteIndex map, bool accumulate, int64_t n4) {
  CAST_KERNEL_LOOP(i, n4) {
    const float4 v = x[map.input_offset<int32_t>(static_cast<int32_t>(i))];
    if (accumulate) {
      float4 w = y[i];
      w.x += v.x, w.y += v.y, w.z += v.z, w.w += v.w;
      y[i] = w;
    } else {
      y[i] = v;
    }
  }
}

// `map` in float4 units, or ndim 0 where the copy cannot move four floats at a time.
PermuteIndex in_fours(const PermuteIndex& map, const float* y, const float* x) {
  PermuteIndex four;
  const int last = map.ndim - 1;
  if (last < 0 || map.in_stride[last] != 1 || map.out_shape[last] % 4 != 0 ||
      reinterpret_cast<uintptr_t>(y) % 16 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return four;
  for (int d = 0; d < last; ++d)
    if (map.in_stride[d] % 4 != 0) return four;
  four = map;
  for (int d = 0; d < last; ++d) four.in_stride[d] /= 4;
  four.out_shape[last] /= 4;
  return four;
}

void permute(Tensor& y, const Tensor& x, const PermuteIndex& idx, bool accumulate) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const PermuteIndex map = idx.coalesced();  // one divide per remaining dimension
  const PermuteIndex four = in_fours(map, fptr(y), fptr(x));
  if (four.ndim > 0 && n < INT32_MAX) {
    CAST_LAUNCH(permute4_kernel, blocks_for(n / 4), kThreads, 0, reinterpret_cast<float4*>(fptr(y)),
                reinterpret_cast<const float4*>(fptr(x)), four, accumulate, n / 4);
  } else if (n < INT32_MAX)
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
