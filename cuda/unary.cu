// Elementwise functions (f32); the math is math/unary_math.h, shared with the CPU.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/unary.h"

namespace cast::cuda {

__global__ void unary_forward_kernel(float* y, UnaryOp op, const float* x, int64_t n) {
  CAST_KERNEL_LOOP(i, n) y[i] = unary_apply(op, x[i]);
}

__global__ void unary_backward_kernel(float* dx, UnaryOp op, const float* dy, const float* x, const float* y,
                                      int64_t n) {
  CAST_KERNEL_LOOP(i, n) dx[i] += dy[i] * unary_derivative(op, x[i], y[i]);
}

void unary_forward(Tensor& y, UnaryOp op, const Tensor& x) {
  const int64_t n = x.numel();
  CAST_LAUNCH(unary_forward_kernel, blocks_for(n), kThreads, 0, fptr(y), op, fptr(x), n);
  CUDA_CHECK_LAUNCH();
}

void unary_backward(Tensor& dx, UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y) {
  const int64_t n = x.numel();
  CAST_LAUNCH(unary_backward_kernel, blocks_for(n), kThreads, 0, fptr(dx), op, fptr(dy), fptr(x), fptr(y), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
