#pragma once
// Softmax and log-softmax over the last axis, with an optional mask.
//
// The mask (1 = keep, 0 = masked out) has the last dim L of x and P rows, where P divides the
// number of rows R of x: row r of x uses mask row r / (R / P). So a key mask (B, N) serves
// scores (B, H, N, N). Masked entries output 0 (in log-softmax too) and get no gradient;
// a fully masked row outputs zeros.
#include "tensor/tensor.h"

namespace cast::ops {

struct MaskRows {
  int64_t rows = 0, len = 0, group = 1;  // x is (rows, len); mask row = r / group
};
MaskRows mask_rows(const char* op, const Tensor& x, const Tensor& mask);

void softmax_forward(Tensor& y, const Tensor& x, const Tensor& mask, bool log);
// dx += softmax'(x)ᵀ dy, from the saved output y (softmax or log-softmax)
void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& mask, bool log);

// The CPU's row forms, for fused kernels that end in a softmax over rows they computed
// themselves: one row y = softmax(x) (x may be y for the softmax, not the log-softmax), and one
// row's gradient added to dr, from the saved output yr. mask: the row's mask or nullptr.
template <class T>
void softmax_row(T* y, const T* x, const T* mask, int64_t n, bool log);
template <class T>
void softmax_row_backward(T* dr, const T* gr, const T* yr, const T* mr, int64_t n, bool log);

Tensor softmax(const Tensor& x, const Tensor& mask = Tensor());
Tensor log_softmax(const Tensor& x, const Tensor& mask = Tensor());

}  // namespace cast::ops
