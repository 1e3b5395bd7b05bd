#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// Row-major, batched c = alpha op(a) op(b) + beta c through cuBLAS.
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
          int64_t batch, int64_t m, int64_t n, int64_t k, bool allow_tf32);
}  // namespace cast::cuda
