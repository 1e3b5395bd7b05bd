// Matrix products through cuBLAS. cuBLAS is column-major: a row-major (m, n) matrix is its
// column-major transpose, so C = op(A) op(B) is computed as Cᵀ = op(B)ᵀ op(A)ᵀ.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/elementwise.h"
#include "cuda/matmul.h"
#include "cuda/runtime.h"

namespace cast::cuda {

void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha, double beta, int64_t batch,
          int64_t m, int64_t n, int64_t k, Precision precision) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {  // no products: C = beta C, as the CPU path; cuBLAS does not promise to write C then
    Tensor whole = c.view({batch * m * n});
    if (beta == 0.0) CUDA_CHECK(cudaMemsetAsync(fptr(whole), 0, whole.numel() * sizeof(float)));  // never reads C
    else if (beta != 1.0) affine(whole, whole, beta, 0.0, false);
    return;
  }
  cublasHandle_t h = cublas_handle();
  CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  const int ldb = static_cast<int>(std::max<int64_t>(1, tb ? k : n));
  const int lda = static_cast<int>(std::max<int64_t>(1, ta ? m : k)), ldc = static_cast<int>(n);
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (precision == Precision::fp32) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(h, op_b, op_a, static_cast<int>(n), static_cast<int>(m),
                                           static_cast<int>(k), &alpha_f, fptr(b), ldb, k * n, fptr(a), lda, m * k,
                                           &beta_f, fptr(c), ldc, m * n, static_cast<int>(batch)));
    return;
  }
  const cublasComputeType_t compute =
      precision == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_FAST_16BF;
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                                          &alpha_f, fptr(b), CUDA_R_32F, ldb, k * n, fptr(a), CUDA_R_32F, lda, m * k,
                                          &beta_f, fptr(c), CUDA_R_32F, ldc, m * n, static_cast<int>(batch), compute,
                                          CUBLAS_GEMM_DEFAULT));
}

}  // namespace cast::cuda
