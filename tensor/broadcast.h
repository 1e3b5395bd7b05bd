#pragma once
// Numpy-style broadcasting of two shapes, as an index map both CPU loops and CUDA kernels use.
#include <cstdint>

#include "tensor/hd.h"
#include "tensor/tensor.h"

namespace cast {

constexpr int kMaxDims = 8;

struct BroadcastIndex {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};     // output shape
  int64_t stride_a[kMaxDims] = {};  // 0 on broadcast dimensions
  int64_t stride_b[kMaxDims] = {};

  // Offsets into a and b of output element i.
  CAST_HD void offsets(int64_t i, int64_t& ia, int64_t& ib) const {
    ia = 0;
    ib = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t c = i % shape[d];
      i /= shape[d];
      ia += c * stride_a[d];
      ib += c * stride_b[d];
    }
  }
};

// The broadcast result shape; throws naming `op` when the shapes are incompatible.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
BroadcastIndex make_broadcast_index(const Shape& out, const Shape& a, const Shape& b);

}  // namespace cast
