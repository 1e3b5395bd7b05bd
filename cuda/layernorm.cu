// LayerNorm: one block per row for the statistics and dx; a two-stage column reduction for
// dgamma, dbeta.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/layernorm.h"

namespace cast::cuda {

__global__ void layernorm_forward_kernel(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                                         const float* beta, int64_t d, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * d;
  float s = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
  const float mu = block_reduce<false>(s) / d;
  float v = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) v += (xr[j] - mu) * (xr[j] - mu);
  const float rs = rsqrtf(block_reduce<false>(v) / d + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) y[r * d + j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
  if (threadIdx.x == 0) {
    mean[r] = mu;
    rstd[r] = rs;
  }
}

__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, int64_t d) {
  const int64_t r = blockIdx.x;
  const float mu = mean[r], rs = rstd[r];
  const float *xr = x + r * d, *gr = dy + r * d;
  float sg = 0, sgx = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float g = gr[j] * gamma[j];
    sg += g;
    sgx += g * (xr[j] - mu) * rs;
  }
  const float mean_g = block_reduce<false>(sg) / d, mean_gx = block_reduce<false>(sgx) / d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float xhat = (xr[j] - mu) * rs;
    dx[r * d + j] += rs * (gr[j] * gamma[j] - mean_g - xhat * mean_gx);
  }
}

// The parameter gradients sum over every row: a two-stage reduction. Stage 1: block (x, y)
// takes 32 columns and one chunk of rows; its 32 x 8 threads read rows in coalesced lines of 32
// columns, and the 8 partial sums of a column meet in shared memory. Stage 2: one thread per
// column adds the chunks' partials in chunk order (deterministic, no atomics).
constexpr int kColumns = 32, kRowThreads = 8;

__global__ void layernorm_dparams_partial_kernel(float* partial_g, float* partial_b, const float* dy, const float* x,
                                                 const float* mean, const float* rstd, int64_t rows, int64_t d,
                                                 int64_t rows_per_chunk) {
  CAST_SHARED_ARRAY(float, sum_g, kColumns* kRowThreads);
  CAST_SHARED_ARRAY(float, sum_b, kColumns* kRowThreads);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kColumns) + tx, chunk = blockIdx.y;
  const int64_t first = chunk * rows_per_chunk, last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sg = 0, sb = 0;
  if (j < d)
    for (int64_t r = first + ty; r < last; r += kRowThreads) {
      const float g = dy[r * d + j];
      sg += g * (x[r * d + j] - mean[r]) * rstd[r];
      sb += g;
    }
  sum_g[ty * kColumns + tx] = sg;
  sum_b[ty * kColumns + tx] = sb;
  __syncthreads();
  if (ty == 0 && j < d) {
    for (int k = 1; k < kRowThreads; ++k) {
      sg += sum_g[k * kColumns + tx];
      sb += sum_b[k * kColumns + tx];
    }
    partial_g[chunk * d + j] = sg;
    partial_b[chunk * d + j] = sb;
  }
}

// One warp per column sums its chunks (a thread per column, walking 1024 chunks one load after
// another, took 0.22 ms for 256 columns on an H100).
__global__ void layernorm_dparams_finish_kernel(float* dgamma, float* dbeta, const float* partial_g,
                                                const float* partial_b, int64_t chunks, int64_t d) {
  const int64_t warps = blockDim.x / 32, step = warps * gridDim.x;
  for (int64_t j = blockIdx.x * warps + threadIdx.x / 32; j < d; j += step) {  // the same in a warp
    float sg = 0, sb = 0;
    for (int64_t c = threadIdx.x % 32; c < chunks; c += 32) {
      sg += partial_g[c * d + j];
      sb += partial_b[c * d + j];
    }
    sg = warp_sum(sg), sb = warp_sum(sb);
    if (threadIdx.x % 32 == 0) {
      if (dgamma) dgamma[j] += sg;
      if (dbeta) dbeta[j] += sb;
    }
  }
}

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       int64_t rows, int64_t d, double eps) {
  if (rows == 0) return;
  CAST_LAUNCH(layernorm_forward_kernel, static_cast<unsigned>(rows), kThreads, 0, fptr(y), fptr(mean), fptr(rstd),
              fptr(x), fptr(gamma), fptr(beta), d, static_cast<float>(eps));
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t d) {
  if (rows == 0) return;
  if (dx) {
    CAST_LAUNCH(layernorm_dx_kernel, static_cast<unsigned>(rows), kThreads, 0, fptr(*dx), fptr(dy), fptr(x),
                fptr(gamma), fptr(mean), fptr(rstd), d);
    CUDA_CHECK_LAUNCH();
  }
  if (dgamma || dbeta) {
    // chunks of at least 64 rows, at most 1024 chunks: stage 2 reads 1024 partials per column at most
    const int64_t chunks = std::min<int64_t>(1024, (rows + 63) / 64), rows_per_chunk = (rows + chunks - 1) / chunks;
    Tensor partial_g = Tensor::empty({chunks, d}, DType::f32, Device::cuda);
    Tensor partial_b = Tensor::empty({chunks, d}, DType::f32, Device::cuda);
    const dim3 grid(static_cast<unsigned>((d + kColumns - 1) / kColumns), static_cast<unsigned>(chunks));
    CAST_LAUNCH(layernorm_dparams_partial_kernel, grid, dim3(kColumns, kRowThreads), 0, fptr(partial_g),
                fptr(partial_b), fptr(dy), fptr(x), fptr(mean), fptr(rstd), rows, d, rows_per_chunk);
    CUDA_CHECK_LAUNCH();
    CAST_LAUNCH(layernorm_dparams_finish_kernel, blocks_for(d * 32), kThreads, 0, dgamma ? fptr(*dgamma) : nullptr,
                dbeta ? fptr(*dbeta) : nullptr, fptr(partial_g), fptr(partial_b), chunks, d);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace cast::cuda
