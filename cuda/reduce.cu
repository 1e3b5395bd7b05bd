// Sum over one axis of a tensor viewed as (outer, n, inner).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/reduce.h"
#include "math/sum_order.h"

namespace cast::cuda {

// inner > 1, stage 1: one thread per (outer, chunk, column) sums its chunk of rows from 0 in row
// order (coalesced across columns). With one chunk it writes the result directly.
__global__ void sum_chunks_kernel(float* partial, const float* x, int64_t outer, int64_t n, int64_t inner,
                                  int64_t chunks, float scale) {
  CAST_KERNEL_LOOP(e, outer * chunks * inner) {
    const int64_t i = e % inner, c = (e / inner) % chunks, a = e / (inner * chunks);
    const int64_t end = (c + 1) * kSumChunk < n ? (c + 1) * kSumChunk : n;
    float s = 0;
    for (int64_t j = c * kSumChunk; j < end; ++j) s += x[(a * n + j) * inner + i];
    partial[e] = chunks == 1 ? s * scale : s;
  }
}

// stage 2: one thread per output sums the chunk sums in chunk order (the CPU's order).
__global__ void sum_partials_kernel(float* y, const float* partial, int64_t outer, int64_t inner, int64_t chunks,
                                    float scale) {
  CAST_KERNEL_LOOP(o, outer * inner) {
    const int64_t a = o / inner, i = o % inner;
    float s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[(a * chunks + c) * inner + i];
    y[o] = s * scale;
  }
}

// inner == 1 and short rows (up to kWarpRowLength): one warp per output, eight to a block. A
// block per row of 256 (LayerNorm-wide) rows took 0.1 ms for 131072 rows on an H100: each block
// did one load per thread and two barriers.
constexpr int64_t kWarpRowLength = 2048;
__global__ void sum_short_rows_kernel(float* y, const float* x, int64_t rows, int64_t n, float scale) {
  const int64_t warps = blockDim.x / 32, step = warps * gridDim.x;
  for (int64_t row = blockIdx.x * warps + threadIdx.x / 32; row < rows; row += step) {  // the same in a warp
    const float* r = x + row * n;
    float s = 0;
    for (int64_t j = threadIdx.x % 32; j < n; j += 32) s += r[j];
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) y[row] = s * scale;
  }
}

// inner == 1, few long rows (a parameter's squared norm for gradient clipping is one row of all
// its elements): a block per row left most of the GPU idle, 0.2 ms for each of a Text step's 26
// parameters on an H100. Stage 1 sums chunks of kLongRowChunk, a block each; stage 2 sums each
// row's chunk sums (the same call again: a warp each). Rows of 65536 or more only.
constexpr int64_t kLongRowChunk = 16384;
__global__ void sum_row_chunks_kernel(float* partial, const float* x, int64_t n, int64_t chunks) {
  const int64_t r = blockIdx.x / chunks, c = blockIdx.x % chunks;
  const int64_t end = (c + 1) * kLongRowChunk < n ? (c + 1) * kLongRowChunk : n;
  const float* row = x + r * n;
  float s = 0;
  for (int64_t j = c * kLongRowChunk + threadIdx.x; j < end; j += blockDim.x) s += row[j];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// inner == 1: one block per output, reducing a contiguous row.
__global__ void sum_rows_kernel(float* y, const float* x, int64_t n, float scale) {
  const float* row = x + blockIdx.x * n;
  float s = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += row[j];
  s = block_reduce<false>(s);
  if (threadIdx.x == 0) y[blockIdx.x] = s * scale;
}

__global__ void sum_backward_kernel(float* dx, const float* dy, int64_t outer, int64_t n, int64_t inner, float scale) {
  CAST_KERNEL_LOOP(e, outer * n * inner) {
    const int64_t i = e % inner, a = e / (n * inner);
    dx[e] += scale * dy[a * inner + i];
  }
}

void sum_axis_forward(Tensor& y, const Tensor& x, int64_t outer, int64_t n, int64_t inner, double scale) {
  if (outer * inner == 0) return;  // nothing to write (and a 0-block launch is an error)
  if (inner == 1 && n <= kWarpRowLength) {
    CAST_LAUNCH(sum_short_rows_kernel, blocks_for(outer * 32), kThreads, 0, fptr(y), fptr(x), outer, n,
                static_cast<float>(scale));
  } else if (inner == 1 && outer < 1024 && n >= 4 * kLongRowChunk) {
    const int64_t chunks = (n + kLongRowChunk - 1) / kLongRowChunk;
    Tensor partial = Tensor::empty({outer, chunks}, DType::f32, Device::cuda);
    CAST_LAUNCH(sum_row_chunks_kernel, static_cast<unsigned>(outer * chunks), kThreads, 0, fptr(partial), fptr(x), n,
                chunks);
    sum_axis_forward(y, partial, outer, chunks, 1, scale);
  } else if (inner == 1 && outer <= 2147483647) {
    CAST_LAUNCH(sum_rows_kernel, static_cast<unsigned>(outer), kThreads, 0, fptr(y), fptr(x), n,
                static_cast<float>(scale));
  } else {
    const int64_t chunks = n > 0 ? (n + kSumChunk - 1) / kSumChunk : 1;
    const float s = static_cast<float>(scale);
    if (chunks == 1) {
      CAST_LAUNCH(sum_chunks_kernel, blocks_for(outer * inner), kThreads, 0, fptr(y), fptr(x), outer, n, inner, chunks,
                  s);
    } else {
      Tensor partial = Tensor::empty({outer, chunks, inner}, DType::f32, Device::cuda);
      CAST_LAUNCH(sum_chunks_kernel, blocks_for(outer * chunks * inner), kThreads, 0, fptr(partial), fptr(x), outer, n,
                  inner, chunks, s);
      CAST_LAUNCH(sum_partials_kernel, blocks_for(outer * inner), kThreads, 0, fptr(y), fptr(partial), outer, inner,
                  chunks, s);
    }
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
