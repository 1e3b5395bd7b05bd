#pragma once
#include "tensor/matrix_layout.h"
#include "tensor/precision.h"
#include "tensor/tensor.h"

namespace cast::cuda {
// Row-major, batched c = alpha op(a) op(b) + beta c through cuBLAS, FP32 tensors; the products
// at `precision`: FP32 (cublasSgemm, no tensor-core math), TF32 (CUBLAS_COMPUTE_32F_FAST_TF32) or
// BF16 (CUBLAS_COMPUTE_32F_FAST_16BF: cuBLAS rounds the FP32 operands to BF16 and accumulates in
// FP32), always with FP32 accumulation and FP32 results.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
          int64_t batch, int64_t m, int64_t n, int64_t k, Precision precision);
// The same over matrices laid out inside the tensors (tensor/matrix_layout.h), checked by the
// caller (ops::gemm_laid_out) to stay inside them: one strided batched cuBLAS call.
void gemm_laid_out(Tensor& c, const MatrixLayout& lc, const Tensor& a, const MatrixLayout& la, const Tensor& b,
                   const MatrixLayout& lb, bool trans_a, bool trans_b, double alpha, double beta, int64_t batch,
                   int64_t m, int64_t n, int64_t k, Precision precision);
}  // namespace cast::cuda
