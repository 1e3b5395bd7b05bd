#pragma once
// Shape and layout ops: reshape (a view), permute and transpose (copies; every tensor is
// contiguous), concat and split along an axis.
#include <vector>

#include "tensor/permute_index.h"
#include "tensor/tensor.h"

namespace cast::ops {

Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1

PermuteIndex make_permute_index(const Shape& in, const std::vector<int>& perm);
// y[..] = x permuted; dx += dy permuted back. `accumulate` adds instead of writing.
void permute_forward(Tensor& y, const Tensor& x, const std::vector<int>& perm, bool accumulate = false);
// the backward: dx += dy permuted back (written, not added, with accumulate false: a fresh buffer)
void permute_backward(Tensor& dx, const Tensor& dy, const std::vector<int>& perm, bool accumulate = true);
Tensor permute(const Tensor& x, const std::vector<int>& perm);
Tensor transpose(const Tensor& x, int axis0, int axis1);

// Copies `rows` rows of `row_len` elements between two tensors with their own row strides
// and element offsets; the building block of concat and split.
struct RowBlock {
  int64_t rows = 0, row_len = 0;
  int64_t dst_offset = 0, dst_stride = 0;
  int64_t src_offset = 0, src_stride = 0;
};
void copy_rows(Tensor& dst, const Tensor& src, const RowBlock& block, bool accumulate);

void concat_forward(Tensor& y, const std::vector<Tensor>& xs, int axis);
void concat_backward(const std::vector<Tensor*>& dxs, const std::vector<Tensor>& xs, const Tensor& dy, int axis);
Tensor concat(const std::vector<Tensor>& xs, int axis);
// Pieces of the given sizes along `axis` (the sizes must add up to its length).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis);

}  // namespace cast::ops
