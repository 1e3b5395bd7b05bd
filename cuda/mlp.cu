// The elementwise passes of ops::mlp (f32). Each element takes the values of the reference's
// kernels: the bias add of binary_forward, then unary_forward's GELU (math/unary_math.h) on the
// sum it stored; the derivative as unary_backward adds it into zeros.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/mlp.h"
#include "math/unary_math.h"

namespace cast::cuda {

namespace {

__global__ void bias_gelu_kernel(float* z, float* a, const float* b, int64_t cols, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    const float sum = z[i] + b[i % cols];
    z[i] = sum;
    a[i] = unary_apply(UnaryOp::gelu, sum);
  }
}

// Each element reads its own da before writing its dz: dz may be da.
__global__ void gelu_backward_kernel(float* dz, const float* da, const float* z, int64_t n) {
  // 0 + v, as the reference's accumulation into zeros gives it (+0 where v is -0); GELU's
  // derivative reads x alone, so z stands in for y
  CAST_KERNEL_LOOP(i, n) dz[i] = 0.f + da[i] * unary_derivative(UnaryOp::gelu, z[i], z[i]);
}

}  // namespace

void bias_gelu(Tensor& z, Tensor& a, const Tensor& b) {
  const int64_t n = z.numel(), cols = b.numel();
  if (n == 0) return;
  CAST_LAUNCH(bias_gelu_kernel, blocks_for(n), kThreads, 0, fptr(z), fptr(a), fptr(b), cols, n);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(Tensor& dz, const Tensor& da, const Tensor& z) {
  const int64_t n = z.numel();
  if (n == 0) return;
  CAST_LAUNCH(gelu_backward_kernel, blocks_for(n), kThreads, 0, fptr(dz), fptr(da), fptr(z), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
