#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
void index_min_max(const Tensor& idx, int64_t& mn, int64_t& mx);
void gather_rows(Tensor& out, const Tensor& x, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d,
                 bool accumulate);
void scatter_add_rows(Tensor& dx, const Tensor& dout, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d);
}  // namespace cast::cuda
