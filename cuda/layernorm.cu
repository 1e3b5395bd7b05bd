// LayerNorm: one block per row for the statistics and dx; one thread per column for dgamma, dbeta.
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

__global__ void layernorm_dx_kernel(float* dx, const float* dy, const float* x, const float* gamma,
                                    const float* mean, const float* rstd, int64_t d) {
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

__global__ void layernorm_dparams_kernel(float* dgamma, float* dbeta, const float* dy, const float* x,
                                         const float* mean, const float* rstd, int64_t rows, int64_t d) {
  CAST_KERNEL_LOOP(j, d) {
    float sg = 0, sb = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float g = dy[r * d + j];
      sg += g * (x[r * d + j] - mean[r]) * rstd[r];
      sb += g;
    }
    if (dgamma) dgamma[j] += sg;
    if (dbeta) dbeta[j] += sb;
  }
}

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                       const Tensor& beta, int64_t rows, int64_t d, double eps) {
  if (rows == 0) return;
  CAST_LAUNCH(layernorm_forward_kernel, static_cast<unsigned>(rows), kThreads, 0, fptr(y), fptr(mean), fptr(rstd), fptr(x),
                                                                     fptr(gamma), fptr(beta), d,
                                                                     static_cast<float>(eps));
  CUDA_CHECK_LAUNCH();
}

void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t d) {
  if (rows == 0) return;
  if (dx) {
    CAST_LAUNCH(layernorm_dx_kernel, static_cast<unsigned>(rows), kThreads, 0, fptr(*dx), fptr(dy), fptr(x), fptr(gamma),
                                                                  fptr(mean), fptr(rstd), d);
    CUDA_CHECK_LAUNCH();
  }
  if (dgamma || dbeta) {
    CAST_LAUNCH(layernorm_dparams_kernel, blocks_for(d), kThreads, 0, dgamma ? fptr(*dgamma) : nullptr,
                                                          dbeta ? fptr(*dbeta) : nullptr, fptr(dy), fptr(x),
                                                          fptr(mean), fptr(rstd), rows, d);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace cast::cuda
