#pragma once
// Gathering rows by an index tensor and its adjoint, scatter-adding rows. These move tokens into
// clusters and back (CAST), and look up embeddings.
#include "tensor/tensor.h"

namespace cast::ops {

// Throws naming `op` unless every index lies in [lo, hi). For CUDA indices the check runs on the
// device and a failure is raised when the host next waits for the device (a copy back or a
// synchronize); the kernels that use indices skip out-of-range ones meanwhile.
void check_index_range(const char* op, const Tensor& idx, int64_t lo, int64_t hi);

// x: (B, N, D), idx: (B, M) int, −1 = empty slot (a zero row) -> out: (B, M, D).
// With `accumulate`, out += instead of out =.
void gather_rows_forward(Tensor& out, const Tensor& x, const Tensor& idx, bool accumulate = false);
// dx: (B, N, D) += rows of dout: (B, M, D) added at idx (the adjoint of gather).
void gather_rows_backward(Tensor& dx, const Tensor& dout, const Tensor& idx);

Tensor gather_rows(const Tensor& x, const Tensor& idx);
// src: (B, M, D) -> (B, n, D) holding the sum of the rows sent to each position.
Tensor scatter_add_rows(const Tensor& src, const Tensor& idx, int64_t n);

// table: (V, D), idx: any shape of ints in [0, V) -> (idx..., D).
Tensor embedding(const Tensor& table, const Tensor& idx);

}  // namespace cast::ops
