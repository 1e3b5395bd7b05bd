// AdamW update, one thread per element (same arithmetic as train/adamw.cpp).
#include "cuda/adamw.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "math/clipping.h"

namespace cast::cuda {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, float lr, float b1, float b2, float eps,
                             float wd, float c1, float c2, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    m[i] = b1 * m[i] + (1.f - b1) * g[i];
    v[i] = b2 * v[i] + (1.f - b2) * g[i] * g[i];
    const float mhat = m[i] / c1, vhat = v[i] / c2;
    p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
  }
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, double lr, double beta1, double beta2,
                  double eps, double weight_decay, double correction1, double correction2) {
  const int64_t n = param.numel();
  CAST_LAUNCH(adamw_kernel, blocks_for(n), kThreads, 0, fptr(param), fptr(grad), fptr(m), fptr(v),
              static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps),
              static_cast<float>(weight_decay), static_cast<float>(correction1), static_cast<float>(correction2), n);
  CUDA_CHECK_LAUNCH();
}

__global__ void clip_factor_kernel(float* factor, const float* squared_norm, double max_norm) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  factor[0] = static_cast<float>(clip_factor_of(static_cast<double>(squared_norm[0]), max_norm));
}

void clip_factor(Tensor& factor, const Tensor& squared_norm, double max_norm) {
  CAST_LAUNCH(clip_factor_kernel, 1, 32, 0, fptr(factor), fptr(squared_norm), max_norm);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
