#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// Every value of idx in [lo, hi), checked without a round trip: a failure is raised at the host's
// next wait for the device (cuda/deferred_checks.h).
void check_index_range_later(const char* op, const Tensor& idx, int64_t lo, int64_t hi);
void gather_rows(Tensor& out, const Tensor& x, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d,
                 bool accumulate);
void scatter_add_rows(Tensor& dx, const Tensor& dout, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d);
}  // namespace cast::cuda
