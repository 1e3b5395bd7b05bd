#pragma once
// The part of cuBLAS that cuda/ uses, for the emulation build: column-major strided-batched
// sgemm computed on the CPU with plain loops (cuda/emulation/runtime_api.cpp).
#include "cuda_runtime.h"

struct cublasContext;
using cublasHandle_t = cublasContext*;
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_INVALID_VALUE = 7 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* a, int lda,
                                         long long stride_a, const float* b, int ldb, long long stride_b,
                                         const float* beta, float* c, int ldc, long long stride_c, int batch);
// The type combinations cast uses, FP32 results and FP32 sums always: FP32 operands, where the
// FAST_TF32 and FAST_16BF compute types round every operand to TF32 or BF16 (to nearest) before
// the products; or BF16 operands with CUBLAS_COMPUTE_32F. Any other is refused, as cuBLAS
// refuses what it does not support.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* a, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* b, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* c, cudaDataType_t c_type,
                                          int ldc, long long stride_c, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo);
