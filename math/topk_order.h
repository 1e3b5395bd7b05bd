#pragma once
// The order of top-k, written once for the CPU op and the CUDA kernel: larger values first, NaN
// after every number, equal values (and NaNs among themselves) in ascending position. A strict
// total order, so every slot of a row gets a distinct index even when the row holds NaN.
#include <cstdint>

#include "tensor/hd.h"

namespace cast {

template <class T>
CAST_HD bool ranks_before(T xa, int64_t a, T xb, int64_t b) {
  const bool nan_a = xa != xa, nan_b = xb != xb;
  if (nan_a != nan_b) return nan_b;  // the number ranks ahead of the NaN
  if (!nan_a && xa != xb) return xa > xb;
  return a < b;
}

}  // namespace cast
