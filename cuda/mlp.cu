// The elementwise passes of ops::mlp (f32). Each element takes the values of the reference's
// kernels: the bias add of binary_forward, then unary_forward's GELU (math/unary_math.h) on the
// sum it stored; the derivative as unary_backward adds it into zeros. Where the hidden activation
// is a BF16 tensor (the products' operand at --precision bf16), each element is that GELU rounded
// as the products' operand copies round it (tensor/bf16.h).
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/mlp.h"
#include "math/unary_math.h"
#include "tensor/bf16.h"

namespace cast::cuda {

namespace {

// A: float, or uint16_t for a BF16 a.
__device__ __forceinline__ void store_activation(float* a, int64_t i, float v) { a[i] = v; }
__device__ __forceinline__ void store_activation(uint16_t* a, int64_t i, float v) { a[i] = bf16_bits_of(v); }

template <class A>
__global__ void bias_gelu_kernel(float* z, A* a, const float* b, int64_t cols, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    const float sum = z[i] + b[i % cols];
    z[i] = sum;
    store_activation(a, i, unary_apply(UnaryOp::gelu, sum));
  }
}

// a = GELU(z) into a BF16 a (an FP32 a is unary_forward's)
__global__ void gelu_bf16_kernel(uint16_t* a, const float* z, int64_t n) {
  CAST_KERNEL_LOOP(i, n) a[i] = bf16_bits_of(unary_apply(UnaryOp::gelu, z[i]));
}

uint16_t* bf16_ptr(Tensor& t) {
  CAST_CHECK(t.dtype() == DType::bf16 && t.is_cuda(), "mlp: expected a BF16 CUDA tensor, got {}", t.describe());
  return static_cast<uint16_t*>(t.raw_data());
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
  if (a.dtype() == DType::bf16)
    CAST_LAUNCH(bias_gelu_kernel<uint16_t>, blocks_for(n), kThreads, 0, fptr(z), bf16_ptr(a), fptr(b), cols, n);
  else
    CAST_LAUNCH(bias_gelu_kernel<float>, blocks_for(n), kThreads, 0, fptr(z), fptr(a), fptr(b), cols, n);
  CUDA_CHECK_LAUNCH();
}

void gelu_bf16(Tensor& a, const Tensor& z) {
  const int64_t n = z.numel();
  if (n == 0) return;
  CAST_LAUNCH(gelu_bf16_kernel, blocks_for(n), kThreads, 0, bf16_ptr(a), fptr(z), n);
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(Tensor& dz, const Tensor& da, const Tensor& z) {
  const int64_t n = z.numel();
  if (n == 0) return;
  CAST_LAUNCH(gelu_backward_kernel, blocks_for(n), kThreads, 0, fptr(dz), fptr(da), fptr(z), n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
