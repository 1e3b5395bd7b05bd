#pragma once
// Index map of a permutation: output element i -> input offset. Shared by CPU and CUDA.
#include <cstdint>

#include "tensor/broadcast.h"
#include "tensor/hd.h"

namespace cast {

struct PermuteIndex {
  int ndim = 0;
  int64_t out_shape[kMaxDims] = {};
  int64_t in_stride[kMaxDims] = {};  // stride in the input of output dimension d

  CAST_HD int64_t input_offset(int64_t i) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (i % out_shape[d]) * in_stride[d];
      i /= out_shape[d];
    }
    return off;
  }
};

}  // namespace cast
