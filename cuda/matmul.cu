// Matrix products through cuBLAS. cuBLAS is column-major: a row-major (m, n) matrix is its
// column-major transpose, so C = op(A) op(B) is computed as Cᵀ = op(B)ᵀ op(A)ᵀ.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/elementwise.h"
#include "cuda/matmul.h"
#include "cuda/launch.cuh"
#include "cuda/runtime.h"
#include "tensor/bf16.h"

namespace cast::cuda {

namespace {

// dst (batches, rows, cols), packed = the matrices laid out in src, rounded to BF16.
__global__ void to_bf16_matrices_kernel(uint16_t* dst, const float* src, int64_t ld, int64_t stride, int64_t rows,
                                        int64_t cols, int64_t n) {
  CAST_KERNEL_LOOP(i, n) {
    const int64_t col = i % cols, row = i / cols % rows, batch = i / cols / rows;
    dst[i] = bf16_bits_of(src[batch * stride + row * ld + col]);
  }
}

// The same eight elements a thread, where a row holds whole eights and every eight starts 16
// bytes aligned (cols, ld and stride multiples of 8 and 4, src aligned): two 16-byte loads and one
// 16-byte store, one division per eight (element by element, such copies ran at a third of the
// memory's bandwidth on an H100).
__global__ void to_bf16_matrices8_kernel(uint4* dst, const float* src, int64_t ld, int64_t stride, int64_t rows,
                                         int64_t cols, int64_t eights) {
  const int64_t row_eights = cols / 8;
  CAST_KERNEL_LOOP(i, eights) {
    const int64_t col = i % row_eights * 8, row = i / row_eights % rows, batch = i / row_eights / rows;
    const float4* from = reinterpret_cast<const float4*>(src + batch * stride + row * ld + col);
    const float4 a = from[0], b = from[1];
    uint16_t h[8] = {bf16_bits_of(a.x), bf16_bits_of(a.y), bf16_bits_of(a.z), bf16_bits_of(a.w),
                     bf16_bits_of(b.x), bf16_bits_of(b.y), bf16_bits_of(b.z), bf16_bits_of(b.w)};
    dst[i] = make_uint4(h[0] | uint32_t{h[1]} << 16, h[2] | uint32_t{h[3]} << 16, h[4] | uint32_t{h[5]} << 16,
                        h[6] | uint32_t{h[7]} << 16);
  }
}

// One operand as cuBLAS takes it at BF16: its BF16 elements and their layout.
struct Bf16Operand {
  const void* data;
  MatrixLayout layout;
};

// The BF16 operands of one product: a BF16 tensor as it lies; an FP32 one as a packed BF16 copy
// (one per product, or one matrix where every product shares it). Both copies share one block of
// device memory, so a step asks the caching allocator for one block per product, the same each
// step. cuBLAS then runs BF16 tensor-core kernels: with FP32 operands and
// CUBLAS_COMPUTE_32F_FAST_16BF it may choose TF32 kernels instead (seen on an H200).
struct Bf16Operands {
  Tensor copies;
  Bf16Operand a, b;

  Bf16Operands(const Tensor& ta, const MatrixLayout& la, int64_t a_rows, int64_t a_cols, const Tensor& tb,
               const MatrixLayout& lb, int64_t b_rows, int64_t b_cols, int64_t batch) {
    const auto copy_size = [&](const Tensor& t, const MatrixLayout& l, int64_t rows, int64_t cols) -> int64_t {
      if (t.dtype() == DType::bf16) return 0;
      return (l.stride == 0 ? 1 : batch) * rows * cols;
    };
    const int64_t na = (copy_size(ta, la, a_rows, a_cols) + 7) / 8 * 8;  // b's copy 16-byte aligned
    const int64_t nb = copy_size(tb, lb, b_rows, b_cols);
    if (na + nb > 0) copies = Tensor::empty({na + nb}, DType::bf16, Device::cuda);
    uint16_t* base = copies.defined() ? static_cast<uint16_t*>(copies.raw_data()) : nullptr;
    a = operand(ta, la, a_rows, a_cols, batch, base);
    b = operand(tb, lb, b_rows, b_cols, batch, base + na);
  }

 private:
  static Bf16Operand operand(const Tensor& t, const MatrixLayout& l, int64_t rows, int64_t cols, int64_t batch,
                             uint16_t* dst) {
    if (t.dtype() == DType::bf16) return {static_cast<const uint16_t*>(t.raw_data()) + l.offset, l};
    const int64_t batches = l.stride == 0 ? 1 : batch, n = batches * rows * cols;
    const float* src = fptr(t) + l.offset;
    const bool by_eights = cols % 8 == 0 && l.ld % 4 == 0 && l.stride % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
    if (by_eights)
      CAST_LAUNCH(to_bf16_matrices8_kernel, blocks_for(n / 8), kThreads, 0, reinterpret_cast<uint4*>(dst), src, l.ld,
                  l.stride, rows, cols, n / 8);
    else
      CAST_LAUNCH(to_bf16_matrices_kernel, blocks_for(n), kThreads, 0, dst, src, l.ld, l.stride, rows, cols, n);
    CUDA_CHECK_LAUNCH();
    return {dst, MatrixLayout{0, cols, l.stride == 0 ? 0 : rows * cols}};
  }
};

}  // namespace

void gemm_laid_out(Tensor& c, const MatrixLayout& lc, const Tensor& a, const MatrixLayout& la, const Tensor& b,
                   const MatrixLayout& lb, bool ta, bool tb, double alpha, double beta, int64_t batch, int64_t m,
                   int64_t n, int64_t k, Precision precision) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // no products: C = beta C, as the CPU path; cuBLAS does not promise to write C then
    const bool packed = lc.offset == 0 && lc.ld == n && (batch == 1 || lc.stride == m * n) && c.numel() == batch * m * n;
    CAST_CHECK(packed, "matmul: a product with no inner dimension into a laid-out result is not supported on CUDA");
    Tensor whole = c.view({batch * m * n});
    if (beta == 0.0) CUDA_CHECK(cudaMemsetAsync(fptr(whole), 0, whole.numel() * sizeof(float)));  // never reads C
    else if (beta != 1.0) affine(whole, whole, beta, 0.0, false);
    return;
  }
  cublasHandle_t h = cublas_handle();
  CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const int lda = static_cast<int>(la.ld), ldb = static_cast<int>(lb.ld), ldc = static_cast<int>(lc.ld);
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  float* pc = fptr(c) + lc.offset;
  if (precision == Precision::bf16 && bf16_gemm() == Bf16Gemm::bf16_operands) {
    const Bf16Operands ops(a, la, ta ? k : m, ta ? m : k, b, lb, tb ? n : k, tb ? k : n, batch);
    const MatrixLayout &pla = ops.a.layout, &plb = ops.b.layout;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        h, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha_f, ops.b.data,
        CUDA_R_16BF, static_cast<int>(plb.ld), plb.stride, ops.a.data, CUDA_R_16BF, static_cast<int>(pla.ld),
        pla.stride, &beta_f, pc, CUDA_R_32F, ldc, lc.stride, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return;
  }
  const float *pa = fptr(a) + la.offset, *pb = fptr(b) + lb.offset;
  if (precision == Precision::fp32) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(h, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                           static_cast<int>(k), &alpha_f, pb, ldb, lb.stride, pa, lda, la.stride,
                                           &beta_f, pc, ldc, lc.stride, static_cast<int>(batch)));
    return;
  }
  const cublasComputeType_t compute =
      precision == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                          &alpha_f, pb, CUDA_R_32F, ldb, lb.stride, pa, CUDA_R_32F, lda, la.stride,
                                          &beta_f, pc, CUDA_R_32F, ldc, lc.stride, static_cast<int>(batch), compute,
                                          CUBLAS_GEMM_DEFAULT));
}

// Packed operands: each matrix right after the one before, its rows as long as the matrix is wide.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha, double beta, int64_t batch,
          int64_t m, int64_t n, int64_t k, Precision precision) {
  const MatrixLayout la{0, std::max<int64_t>(1, ta ? m : k), m * k}, lb{0, std::max<int64_t>(1, tb ? k : n), k * n},
      lc{0, n, m * n};
  gemm_laid_out(c, lc, a, la, b, lb, ta, tb, alpha, beta, batch, m, n, k, precision);
}

}  // namespace cast::cuda
