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

// f32 → bf16 eight elements a thread where both ends are 16-byte aligned: two 16-byte loads and
// one 16-byte store (an operand the products read as BF16, ops::as_product_operand).
__global__ void to_bf16_eights_kernel(uint4* dst, const float4* src, int64_t eights) {
  CAST_KERNEL_LOOP(i, eights) {
    const float4 a = src[2 * i], b = src[2 * i + 1];
    const auto pair = [](float lo, float hi) { return bf16_bits_of(lo) | uint32_t{bf16_bits_of(hi)} << 16; };
    dst[i] = make_uint4(pair(a.x, a.y), pair(a.z, a.w), pair(b.x, b.y), pair(b.z, b.w));
  }
}

}  // namespace

void convert(Tensor& dst, const Tensor& src, bool add) {
  CAST_CHECK((dst.dtype() == DType::f32 || dst.dtype() == DType::bf16) &&
                 (src.dtype() == DType::f32 || src.dtype() == DType::bf16),
             "convert on CUDA: f32 and bf16 only, got {} and {}", dst.describe(), src.describe());
  const int64_t n = src.numel();
  if (n == 0) return;
  if (!add && src.dtype() == DType::f32 && dst.dtype() == DType::bf16 && n % 8 == 0 &&
      reinterpret_cast<uintptr_t>(src.raw_data()) % 16 == 0 && reinterpret_cast<uintptr_t>(dst.raw_data()) % 16 == 0) {
    CAST_LAUNCH(to_bf16_eights_kernel, blocks_for(n / 8), kThreads, 0, static_cast<uint4*>(dst.raw_data()),
                static_cast<const float4*>(src.raw_data()), n / 8);
    CUDA_CHECK_LAUNCH();
    return;
  }
  CAST_LAUNCH(convert_kernel, blocks_for(n), kThreads, 0, dst.raw_data(), dst.dtype() == DType::bf16, src.raw_data(),
              src.dtype() == DType::bf16, n, add);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
