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

  // Offsets into a and b of output element i. I: int64_t, or int32_t where every offset fits
  // (a 32-bit divide costs a fraction of a 64-bit one on a GPU).
  template <class I = int64_t>
  CAST_HD void offsets(I i, I& ia, I& ib) const {
    ia = 0;
    ib = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const I extent = static_cast<I>(shape[d]);
      const I c = i % extent;
      i /= extent;
      ia += c * static_cast<I>(stride_a[d]);
      ib += c * static_cast<I>(stride_b[d]);
    }
  }
};

// The same map with as few dimensions as possible: extent-1 dimensions dropped and neighbours
// merged where both inputs step through them as one (a same-shape op becomes one dimension, a
// bias add two). For the GPU kernels, where each dimension costs a divide per element.
BroadcastIndex coalesce(const BroadcastIndex& idx);

// The broadcast result shape; throws naming `op` when the shapes are incompatible.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
BroadcastIndex make_broadcast_index(const Shape& out, const Shape& a, const Shape& b);

}  // namespace cast
