// Softmax / log-softmax over the last axis with a grouped row mask: one block per row, or for
// short rows (CAST's rows over clusters and within a cluster hold 32 to 128 entries) one warp
// per row, eight rows to a block, so that no thread idles and no block-wide barrier is paid.
#include <climits>

#include "math/softmax_rule.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/softmax.h"

namespace cast::cuda {

constexpr int64_t kShortRow = 128;  // rows up to this length get one warp each

// Which row this thread works on, its first entry and its stride: a block per row, or a warp.
template <bool WarpPerRow>
__device__ int64_t row_of_thread() {
  return WarpPerRow ? blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32 : blockIdx.x;
}
template <bool WarpPerRow>
__device__ int lane_of_thread() {
  return WarpPerRow ? threadIdx.x % 32 : threadIdx.x;
}
template <bool WarpPerRow>
__device__ int row_stride() {
  return WarpPerRow ? 32 : blockDim.x;
}
template <bool WarpPerRow, bool IsMax>
__device__ float row_reduce(float v) {
  if (WarpPerRow) return IsMax ? warp_max(v) : warp_sum(v);
  return block_reduce<IsMax>(v);
}

template <bool WarpPerRow>
__global__ void softmax_forward_kernel(float* y, const float* x, const float* mask, int64_t rows, int64_t len,
                                       int64_t group, bool log) {
  const int64_t r = row_of_thread<WarpPerRow>();
  if (WarpPerRow && r >= rows) return;  // a whole warp leaves together
  const int lane = lane_of_thread<WarpPerRow>(), stride = row_stride<WarpPerRow>();
  const float* xr = x + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  float* yr = y + r * len;
  float mx = softmax_rule::masked<float>();
  for (int64_t j = lane; j < len; j += stride)
    if (!mr || mr[j] != 0.f) mx = fmaxf(mx, xr[j]);
  mx = row_reduce<WarpPerRow, true>(mx);
  if (mx == softmax_rule::masked<float>()) {  // no real entry above −∞: a masked row gives 0, a row of NaN gives NaN
                                              // (as the CPU)
    float nans = 0;
    for (int64_t j = lane; j < len; j += stride)
      nans += (!mr || mr[j] != 0.f) && xr[j] != xr[j] ? 1.f : 0.f;  // x != x: NaN
    nans = row_reduce<WarpPerRow, false>(nans);
    for (int64_t j = lane; j < len; j += stride) yr[j] = softmax_rule::empty_row<float>(nans > 0.f);
    return;
  }
  float total = 0;
  for (int64_t j = lane; j < len; j += stride)
    if (!mr || mr[j] != 0.f) total += softmax_rule::weight(xr[j], mx);
  total = row_reduce<WarpPerRow, false>(total);
  const float log_total = logf(total);
  for (int64_t j = lane; j < len; j += stride) {
    const bool keep = !mr || mr[j] != 0.f;
    yr[j] = !keep ? 0.f : log ? xr[j] - mx - log_total : softmax_rule::weight(xr[j], mx) / total;
  }
}

template <bool WarpPerRow>
__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, const float* mask, int64_t rows,
                                        int64_t len, int64_t group, bool log) {
  const int64_t r = row_of_thread<WarpPerRow>();
  if (WarpPerRow && r >= rows) return;
  const int lane = lane_of_thread<WarpPerRow>(), stride = row_stride<WarpPerRow>();
  const float* yr = y + r * len;
  const float* gr = dy + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  float* dr = dx + r * len;
  float dot = 0, kept = 0;
  for (int64_t j = lane; j < len; j += stride)
    if (!mr || mr[j] != 0.f) {
      dot += log ? gr[j] : yr[j] * gr[j];
      kept += 1.f;
    }
  dot = row_reduce<WarpPerRow, false>(dot);
  kept = row_reduce<WarpPerRow, false>(kept);
  if (kept == 0.f) return;
  for (int64_t j = lane; j < len; j += stride) {
    if (mr && mr[j] == 0.f) continue;
    dr[j] += log ? gr[j] - expf(yr[j]) * dot : softmax_rule::score_gradient(yr[j], gr[j], dot);
  }
}

// Blocks for one warp per row: every row gets its warp (no grid-stride loop in these kernels).
unsigned warp_row_blocks(int64_t rows) {
  const int64_t rows_per_block = kThreads / 32, blocks = (rows + rows_per_block - 1) / rows_per_block;
  CAST_CHECK(blocks <= INT32_MAX, "softmax: {} rows are more than one launch takes", rows);
  return static_cast<unsigned>(blocks);
}

void softmax_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group,
                     bool log) {
  if (rows == 0) return;
  const float* m = mask.defined() ? fptr(mask) : nullptr;
  if (len <= kShortRow)
    CAST_LAUNCH(softmax_forward_kernel<true>, warp_row_blocks(rows), kThreads, 0, fptr(y), fptr(x), m, rows, len, group,
                log);
  else
    CAST_LAUNCH(softmax_forward_kernel<false>, static_cast<unsigned>(rows), kThreads, 0, fptr(y), fptr(x), m, rows, len,
                group, log);
  CUDA_CHECK_LAUNCH();
}

void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& mask, int64_t rows, int64_t len,
                      int64_t group, bool log) {
  if (rows == 0) return;
  const float* m = mask.defined() ? fptr(mask) : nullptr;
  if (len <= kShortRow)
    CAST_LAUNCH(softmax_backward_kernel<true>, warp_row_blocks(rows), kThreads, 0, fptr(dx), fptr(dy), fptr(y), m, rows,
                len, group, log);
  else
    CAST_LAUNCH(softmax_backward_kernel<false>, static_cast<unsigned>(rows), kThreads, 0, fptr(dx), fptr(dy), fptr(y),
                m, rows, len, group, log);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
