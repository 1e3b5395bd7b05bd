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

  // I: int64_t, or int32_t where every offset fits (cheaper divides on a GPU).
  template <class I = int64_t>
  CAST_HD I input_offset(I i) const {
    I off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const I extent = static_cast<I>(out_shape[d]);
      off += (i % extent) * static_cast<I>(in_stride[d]);
      i /= extent;
    }
    return off;
  }

  // The same map with extent-1 dimensions dropped and neighbours that stay neighbours in the
  // input merged (for the GPU kernel: one divide per remaining dimension).
  PermuteIndex coalesced() const {
    PermuteIndex out;
    for (int d = 0; d < ndim; ++d) {
      if (out_shape[d] == 1) continue;
      const int last = out.ndim - 1;
      if (last >= 0 && out.in_stride[last] == in_stride[d] * out_shape[d]) {
        out.out_shape[last] *= out_shape[d];
        out.in_stride[last] = in_stride[d];
        continue;
      }
      out.out_shape[out.ndim] = out_shape[d];
      out.in_stride[out.ndim] = in_stride[d];
      ++out.ndim;
    }
    return out;
  }
};

}  // namespace cast
