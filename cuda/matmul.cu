// Matrix products through cuBLAS. cuBLAS is column-major: a row-major (m, n) matrix is its
// column-major transpose, so C = op(A) op(B) is computed as Cᵀ = op(B)ᵀ op(A)ᵀ.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/elementwise.h"
#include "cuda/matmul.h"
#include "cuda/runtime.h"

namespace cast::cuda {

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
  const float *pa = fptr(a) + la.offset, *pb = fptr(b) + lb.offset;
  float* pc = fptr(c) + lc.offset;
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
