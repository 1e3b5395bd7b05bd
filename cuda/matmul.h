#pragma once
#include "tensor/matrix_layout.h"
#include "tensor/precision.h"
#include "tensor/tensor.h"

namespace cast::cuda {
// Row-major, batched c = alpha op(a) op(b) + beta c through cuBLAS into an FP32 c; the products
// at `precision`, always with FP32 accumulation: FP32 (cublasSgemm, no tensor-core math), TF32
// (CUBLAS_COMPUTE_32F_FAST_TF32 on the FP32 operands) or BF16 (BF16 operands, CUBLAS_COMPUTE_32F:
// an FP32 operand is rounded to a packed BF16 copy first; a BF16 tensor is read as it is), or at
// --bf16-gemm fast16bf CUBLAS_COMPUTE_32F_FAST_16BF on the FP32 operands (tensor/precision.h).
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
          int64_t batch, int64_t m, int64_t n, int64_t k, Precision precision);
// The same over matrices laid out inside the tensors (tensor/matrix_layout.h), checked by the
// caller (ops::gemm_laid_out) to stay inside them: one strided batched cuBLAS call.
void gemm_laid_out(Tensor& c, const MatrixLayout& lc, const Tensor& a, const MatrixLayout& la, const Tensor& b,
                   const MatrixLayout& lb, bool trans_a, bool trans_b, double alpha, double beta, int64_t batch,
                   int64_t m, int64_t n, int64_t k, Precision precision);
}  // namespace cast::cuda
