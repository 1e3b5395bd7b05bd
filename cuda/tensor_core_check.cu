// One warp running one tensor-core instruction of cuda/tensor_core.cuh on matrices from global
// memory, each lane placing its elements where the PTX ISA's fragment layouts say: the tests
// (tests/test_tensor_core.cpp) compare the results with plain products and copies, on the GPU
// and in the emulation alike, so a fragment layout misread on either side fails there.
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/tensor_core.cuh"
#include "cuda/tensor_core_check.h"

namespace cast::cuda {

namespace {

// a: 16 × K row-major, b: K × 8 row-major, c and d: 16 × 8 row-major; one warp.
template <int K>
__global__ void mma_check_kernel(float* d, const float* a, const float* b, const float* c) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t ar[4], br[2];
  if (K == 8) {  // TF32: a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); b0 (t, g) b1 (t+4, g)
    ar[0] = tc::to_tf32(a[g * K + t]), ar[1] = tc::to_tf32(a[(g + 8) * K + t]);
    ar[2] = tc::to_tf32(a[g * K + t + 4]), ar[3] = tc::to_tf32(a[(g + 8) * K + t + 4]);
    br[0] = tc::to_tf32(b[t * 8 + g]), br[1] = tc::to_tf32(b[(t + 4) * 8 + g]);
  } else {  // BF16: pairs (g, 2t..) (g+8, 2t..) (g, 2t+8..) (g+8, 2t+8..); b (2t.., g) (2t+8.., g)
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
      ar[i] = tc::pack_bf16(a[row * K + col], a[row * K + col + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      const int k = 2 * t + 8 * i;
      br[i] = tc::pack_bf16(b[k * 8 + g], b[(k + 1) * 8 + g]);
    }
  }
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];  // c0 (g, 2t) .. c3 (g+8, 2t+1)
  if (K == 8) tc::mma_tf32(acc, ar, br);
  else tc::mma_bf16(acc, ar, br);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

// in: 32 rows of 8 16-bit elements (four 8×8 matrices, row i of matrix i / 8 at row i), copied to
// shared memory with a padded row; out[4 lane + m]: register m of each lane.
template <bool Trans>
__global__ void ldmatrix_check_kernel(uint32_t* out, const uint16_t* in) {
  constexpr int stride = 16;  // elements per shared row: 8 used, 8 of padding
  CAST_SHARED_ARRAY(uint16_t, tile, 32 * stride);
  const int lane = threadIdx.x;
  for (int e = 0; e < 8; ++e) tile[lane * stride + e] = in[lane * 8 + e];
  __syncthreads();
  uint32_t r[4];
  if (Trans) tc::ldmatrix_x4_trans(r, tile, lane * stride);
  else tc::ldmatrix_x4(r, tile, lane * stride);
  for (int m = 0; m < 4; ++m) out[4 * lane + m] = r[m];
}

// Each lane copies chunk `lane` (16 bytes) of src by cp.async into two shared tiles, one group
// each (zeros where !valid[lane]). After waiting with one group left pending and a barrier, every
// lane reads another lane's chunk of the first tile; after waiting for all and a barrier, of the
// second: out[0..127] and out[128..255].
__global__ void cp_async_check_kernel(float* out, const float* src, const int* valid) {
  CAST_SHARED_ARRAY(float, first, 32 * 4);
  CAST_SHARED_ARRAY(float, second, 32 * 4);
  const int lane = threadIdx.x, other = (lane + 5) % 32;
  tc::cp_async16(first, lane * 4, src + lane * 4, valid[lane] != 0);
  tc::cp_async_commit();
  tc::cp_async16(second, lane * 4, src + lane * 4, valid[lane] != 0);
  tc::cp_async_commit();
  tc::cp_async_wait<1>();  // the first group has landed; the second may not have
  __syncthreads();
  for (int e = 0; e < 4; ++e) out[other * 4 + e] = first[other * 4 + e];
  tc::cp_async_wait<0>();
  __syncthreads();
  for (int e = 0; e < 4; ++e) out[128 + other * 4 + e] = second[other * 4 + e];
}

// The device's conversions: TF32 (cvt.rna) bits, and each BF16 (round to nearest even) as an int.
__global__ void round_check_kernel(uint32_t* tf32, int32_t* bf16, const float* x, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    tf32[i] = tc::to_tf32(x[i]);
    bf16[i] = tc::to_bf16(x[i]);
  }
}

}  // namespace

void mma_check(Tensor& d, const Tensor& a, const Tensor& b, const Tensor& c) {
  const int64_t K = a.dim(1);
  CAST_CHECK(K == 8 || K == 16, "mma_check: k is 8 (TF32) or 16 (BF16), got {}", K);
  if (K == 8) CAST_LAUNCH(mma_check_kernel<8>, 1, 32, 0, fptr(d), fptr(a), fptr(b), fptr(c));
  else CAST_LAUNCH(mma_check_kernel<16>, 1, 32, 0, fptr(d), fptr(a), fptr(b), fptr(c));
  CUDA_CHECK_LAUNCH();
}

void ldmatrix_check(Tensor& out, const Tensor& in, bool trans) {
  auto* o = reinterpret_cast<uint32_t*>(out.data<int32_t>());
  const auto* i = reinterpret_cast<const uint16_t*>(in.data<int32_t>());
  if (trans) CAST_LAUNCH(ldmatrix_check_kernel<true>, 1, 32, 0, o, i);
  else CAST_LAUNCH(ldmatrix_check_kernel<false>, 1, 32, 0, o, i);
  CUDA_CHECK_LAUNCH();
}

void cp_async_check(Tensor& out, const Tensor& src, const Tensor& valid) {
  CAST_LAUNCH(cp_async_check_kernel, 1, 32, 0, fptr(out), fptr(src), valid.data<int32_t>());
  CUDA_CHECK_LAUNCH();
}

void round_check(Tensor& tf32, Tensor& bf16, const Tensor& x) {
  CAST_LAUNCH(round_check_kernel, blocks_for(x.numel()), kThreads, 0, reinterpret_cast<uint32_t*>(tf32.data<int32_t>()),
              bf16.data<int32_t>(), fptr(x), x.numel());
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
