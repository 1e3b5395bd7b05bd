// Conversion between f32 and bf16 on the device (ops/convert.h): the rounding of tensor/bf16.h,
// which the CPU's loop uses too, so both devices give the same bits.
#include "cuda/common.cuh"
#include "cuda/convert.h"
#include "cuda/launch.cuh"
#include "tensor/bf16.h"

namespace cast::cuda {

namespace {

__device__ __forceinline__ float load(const void* p, bool bf16, int64_t i) {
  return bf16 ? bf16_value(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__global__ void convert_kernel(void* dst, bool dst_bf16, const void* src, bool src_bf16, int64_t n, bool add) {
  CAST_KERNEL_LOOP(i, n) {
    const float v = add ? load(dst, dst_bf16, i) + load(src, src_bf16, i) : load(src, src_bf16, i);
    if (dst_bf16) static_cast<uint16_t*>(dst)[i] = bf16_bits_of(v);
    else static_cast<float*>(dst)[i] = v;
  }
}

}  // namespace

void convert(Tensor& dst, const Tensor& src, bool add) {
  CAST_CHECK((dst.dtype() == DType::f32 || dst.dtype() == DType::bf16) &&
                 (src.dtype() == DType::f32 || src.dtype() == DType::bf16),
             "convert on CUDA: f32 and bf16 only, got {} and {}", dst.describe(), src.describe());
  const int64_t n = src.numel();
  if (n == 0) return;
  CAST_LAUNCH(convert_kernel, blocks_for(n), kThreads, 0, dst.raw_data(), dst.dtype() == DType::bf16, src.raw_data(),
              src.dtype() == DType::bf16, n, add);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
