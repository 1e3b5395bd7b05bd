// Dropout from the same Philox stream as the CPU: identical masks on both devices.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/dropout.h"
#include "tensor/philox.h"

namespace cast::cuda {

// residual: the stream of x + dropout(t) (ops::dropout_add), added in the same pass; or null
__global__ void dropout_kernel(float* y, const float* x, const float* residual, double p, float scale, uint64_t seed,
                               uint64_t offset, bool accumulate, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    // the product rounded apart from the sum, as dropout then add round it (ops::dropout_add)
    const float v = philox::uniform(seed, offset + i) >= p ? __fmul_rn(x[i], scale) : 0.f;
    y[i] = accumulate ? y[i] + v : residual ? __fadd_rn(residual[i], v) : v;
  }
}

void dropout(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset, bool accumulate,
             const Tensor& residual) {
  const int64_t n = x.numel();
  CAST_LAUNCH(dropout_kernel, blocks_for(n), kThreads, 0, fptr(y), fptr(x),
              residual.defined() ? fptr(residual) : nullptr, p, static_cast<float>(1.0 / (1.0 - p)), seed, offset,
              accumulate, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
