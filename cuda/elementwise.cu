// Broadcasting binary ops and affine maps (f32). Same math as ops/elementwise.cpp via binary_math.h.
#include <climits>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/elementwise.h"

namespace cast::cuda {

// I: the index type of the map (int32_t where every offset fits: cheaper divides).
template <class I>
__global__ void binary_forward_kernel(float* out, BinaryOp op, const float* a, const float* b, BroadcastIndex idx,
                                      int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    I ia, ib;
    idx.offsets<I>(static_cast<I>(i), ia, ib);
    out[i] = binary_apply(op, a[ia], b[ib]);
  }
}

// Full-size partials; ops/ sums them down to the input shapes.
template <class I>
__global__ void binary_backward_kernel(float* ga, float* gb, BinaryOp op, const float* dout, const float* a,
                                       const float* b, BroadcastIndex idx, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    I ia, ib;
    idx.offsets<I>(static_cast<I>(i), ia, ib);
    if (ga) ga[i] = dout[i] * binary_da(op, a[ia], b[ib]);
    if (gb) gb[i] = dout[i] * binary_db(op, a[ia], b[ib]);
  }
}

__global__ void affine_kernel(float* y, const float* x, float alpha, float beta, bool accumulate, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    float v = alpha * x[i] + beta;
    y[i] = accumulate ? y[i] + v : v;
  }
}

// 32-bit index math when the output and both inputs have fewer than 2^31 elements.
static bool fits_32_bits(int64_t n, const Tensor& a, const Tensor& b) {
  return n < INT32_MAX && a.numel() < INT32_MAX && b.numel() < INT32_MAX;
}

void binary_forward(Tensor& out, BinaryOp op, const Tensor& a, const Tensor& b, const BroadcastIndex& idx) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const BroadcastIndex map = coalesce(idx);
  if (fits_32_bits(n, a, b))
    CAST_LAUNCH(binary_forward_kernel<int32_t>, blocks_for(n), kThreads, 0, fptr(out), op, fptr(a), fptr(b), map, n);
  else CAST_LAUNCH(binary_forward_kernel<int64_t>, blocks_for(n), kThreads, 0, fptr(out), op, fptr(a), fptr(b), map, n);
  CUDA_CHECK_LAUNCH();
}

void binary_backward(Tensor* ga, Tensor* gb, BinaryOp op, const Tensor& dout, const Tensor& a, const Tensor& b,
                     const BroadcastIndex& idx) {
  const int64_t n = dout.numel();
  if (n == 0) return;
  const BroadcastIndex map = coalesce(idx);
  float* pa = ga ? fptr(*ga) : nullptr;
  float* pb = gb ? fptr(*gb) : nullptr;
  if (fits_32_bits(n, a, b))
    CAST_LAUNCH(binary_backward_kernel<int32_t>, blocks_for(n), kThreads, 0, pa, pb, op, fptr(dout), fptr(a), fptr(b),
                map, n);
  else
    CAST_LAUNCH(binary_backward_kernel<int64_t>, blocks_for(n), kThreads, 0, pa, pb, op, fptr(dout), fptr(a), fptr(b),
                map, n);
  CUDA_CHECK_LAUNCH();
}

void affine(Tensor& y, const Tensor& x, double alpha, double beta, bool accumulate) {
  const int64_t n = x.numel();
  CAST_LAUNCH(affine_kernel, blocks_for(n), kThreads, 0, fptr(y), fptr(x), static_cast<float>(alpha),
              static_cast<float>(beta), accumulate, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
