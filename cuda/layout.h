#pragma once
#include "tensor/permute_index.h"
#include "tensor/tensor.h"

namespace cast::cuda {
void permute(Tensor& y, const Tensor& x, const PermuteIndex& idx, bool accumulate);
void copy_rows(Tensor& dst, const Tensor& src, int64_t rows, int64_t row_len, int64_t dst_offset, int64_t dst_stride,
               int64_t src_offset, int64_t src_stride, bool accumulate);
}  // namespace cast::cuda
