// Softmax / log-softmax over the last axis with a grouped row mask: one block per row.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/softmax.h"

namespace cast::cuda {

__global__ void softmax_forward_kernel(float* y, const float* x, const float* mask, int64_t len, int64_t group,
                                       bool log) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  float* yr = y + r * len;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    if (!mr || mr[j] != 0.f) mx = fmaxf(mx, xr[j]);
  mx = block_reduce<true>(mx);
  if (mx == -INFINITY) {  // no real entry above −∞: a masked row gives 0, a row of NaN gives NaN (as the CPU)
    float nans = 0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) nans += (!mr || mr[j] != 0.f) && xr[j] != xr[j] ? 1.f : 0.f;  // x != x: NaN
    nans = block_reduce<false>(nans);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) yr[j] = nans > 0.f ? NAN : 0.f;
    return;
  }
  float total = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    if (!mr || mr[j] != 0.f) total += expf(xr[j] - mx);
  total = block_reduce<false>(total);
  const float log_total = logf(total);
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const bool keep = !mr || mr[j] != 0.f;
    yr[j] = !keep ? 0.f : log ? xr[j] - mx - log_total : expf(xr[j] - mx) / total;
  }
}

__global__ void softmax_backward_kernel(float* dx, const float* dy, const float* y, const float* mask, int64_t len,
                                        int64_t group, bool log) {
  const int64_t r = blockIdx.x;
  const float* yr = y + r * len;
  const float* gr = dy + r * len;
  const float* mr = mask ? mask + (r / group) * len : nullptr;
  float* dr = dx + r * len;
  float dot = 0, kept = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    if (!mr || mr[j] != 0.f) {
      dot += log ? gr[j] : yr[j] * gr[j];
      kept += 1.f;
    }
  dot = block_reduce<false>(dot);
  kept = block_reduce<false>(kept);
  if (kept == 0.f) return;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    if (mr && mr[j] == 0.f) continue;
    dr[j] += log ? gr[j] - expf(yr[j]) * dot : yr[j] * (gr[j] - dot);
  }
}

void softmax_forward(Tensor& y, const Tensor& x, const Tensor& mask, int64_t rows, int64_t len, int64_t group,
                     bool log) {
  if (rows == 0) return;
  CAST_LAUNCH(softmax_forward_kernel, static_cast<unsigned>(rows), kThreads, 0, fptr(y), fptr(x),
                                                                   mask.defined() ? fptr(mask) : nullptr, len, group, log);
  CUDA_CHECK_LAUNCH();
}

void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& mask, int64_t rows, int64_t len,
                      int64_t group, bool log) {
  if (rows == 0) return;
  CAST_LAUNCH(softmax_backward_kernel, static_cast<unsigned>(rows), kThreads, 0, 
      fptr(dx), fptr(dy), fptr(y), mask.defined() ? fptr(mask) : nullptr, len, group, log);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
