#include "ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "math/fast_math.h"
#include "math/softmax_rule.h"
#ifdef CAST_WITH_CUDA
#include "cuda/softmax.h"
#endif

namespace cast::ops {

MaskRows mask_rows(const char* op, const Tensor& x, const Tensor& mask) {
  MaskRows m;
  m.len = x.ndim() ? x.dim(-1) : 1;
  m.rows = m.len ? x.numel() / m.len : 0;
  if (!mask.defined()) return m;
  check_same_dtype(op, x, mask);
  check_same_device(op, x, mask);
  CAST_CHECK(mask.ndim() >= 1 && mask.dim(-1) == m.len, "{}: mask {} must end in x's last dim {}", op, mask.describe(),
             m.len);
  int64_t p = mask.numel() / m.len;
  CAST_CHECK(p > 0 && m.rows % p == 0, "{}: mask {} has {} rows, which do not divide the {} rows of {}", op,
             mask.describe(), p, m.rows, x.describe());
  m.group = m.rows / p;
  return m;
}

// One row: masked entries are set to −∞ first, so the max, exp and sum loops run without a
// test per element and vectorise (math/fast_math.h). A fully masked row gives zeros.
template <class T>
void softmax_row(T* y, const T* x, const T* mask, int64_t n, bool log) {
  const T minus_inf = -std::numeric_limits<T>::infinity();
  if (mask)
    for (int64_t j = 0; j < n; ++j) y[j] = mask[j] != T(0) ? x[j] : minus_inf;
  else if (y != x) std::copy(x, x + n, y);
  const T mx = max_of(y, n);  // NaN compares false: an all-NaN row also gives −∞ here
  if (mx == minus_inf) {
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) nan = nan || std::isnan(y[j]);
    std::fill(y, y + n, softmax_rule::empty_row<T>(nan));  // NaN stays NaN; a masked row is 0
    return;
  }
  const T total = softmax_rule::weigh_row(y, n, mx);  // y = exp(x − max), 0 where masked
  if (log) {
    const T shift = softmax_rule::log_sum_exp(mx, total);
    for (int64_t j = 0; j < n; ++j) y[j] = (!mask || mask[j] != T(0)) ? x[j] - shift : T(0);
  } else {
    const T inv = T(1) / total;  // NaN in a row holding a NaN: its masked entries stay 0 (math/fast_math.h)
    if (mask)
      for (int64_t j = 0; j < n; ++j) y[j] = mask[j] != T(0) ? y[j] * inv : T(0);
    else
      for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  }
}

void softmax_forward(Tensor& y, const Tensor& x, const Tensor& mask, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_float(op, x, "x");
  check_same_shape(op, y, x);
  MaskRows m = mask_rows(op, x, mask);
  CAST_ON_CUDA(x, cuda::softmax_forward(y, x, mask, m.rows, m.len, m.group, log));
  CAST_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const T* pm = mask.defined() ? mask.data<T>() : nullptr;
    CAST_OMP("omp parallel for if (m.rows * m.len > 16384)")
    for (int64_t r = 0; r < m.rows; ++r)
      softmax_row(y.data<T>() + r * m.len, x.data<T>() + r * m.len, pm ? pm + (r / m.group) * m.len : nullptr, m.len,
                  log);
  });
}

// One row's gradient, added to dr. A plain function: the unmasked softmax's update loop then
// vectorises (written inside the parallel region's body, GCC kept it scalar).
template <class T>
void softmax_row_backward(T* dr, const T* gr, const T* yr, const T* mr, int64_t n, bool log) {
  T dot = 0;  // softmax: Σ y·dy ; log-softmax: Σ dy
  if (!mr && !log) {
    for (int64_t j = 0; j < n; ++j) dot += yr[j] * gr[j];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) dr[j] += softmax_rule::score_gradient(yr[j], gr[j], dot);
    return;
  }
  for (int64_t j = 0; j < n; ++j)
    if (!mr || mr[j] != T(0)) dot += log ? gr[j] : yr[j] * gr[j];
  bool empty_row = true;
  for (int64_t j = 0; j < n; ++j) empty_row = empty_row && mr && mr[j] == T(0);
  if (empty_row) return;
  for (int64_t j = 0; j < n; ++j) {
    if (mr && mr[j] == T(0)) continue;
    dr[j] += log ? gr[j] - std::exp(yr[j]) * dot : softmax_rule::score_gradient(yr[j], gr[j], dot);
  }
}

template void softmax_row<float>(float*, const float*, const float*, int64_t, bool);
template void softmax_row<double>(double*, const double*, const double*, int64_t, bool);
template void softmax_row_backward<float>(float*, const float*, const float*, const float*, int64_t, bool);
template void softmax_row_backward<double>(double*, const double*, const double*, const double*, int64_t, bool);

void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y, const Tensor& mask, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  MaskRows m = mask_rows(op, y, mask);
  CAST_ON_CUDA(y, cuda::softmax_backward(dx, dy, y, mask, m.rows, m.len, m.group, log));
  CAST_DISPATCH_FLOAT(y.dtype(), op, [&] {
    const T* pm = mask.defined() ? mask.data<T>() : nullptr;
    CAST_OMP("omp parallel for if (m.rows * m.len > 16384)")
    for (int64_t r = 0; r < m.rows; ++r)
      softmax_row_backward(dx.data<T>() + r * m.len, dy.data<T>() + r * m.len, y.data<T>() + r * m.len,
                           pm ? pm + (r / m.group) * m.len : nullptr, m.len, log);
  });
}

struct SoftmaxNode final : autograd::Node {
  bool log = false;
  Tensor x;     // input, receives the gradient
  Tensor y;     // saved output: the backward is written in terms of it
  Tensor mask;  // optional
  const char* name() const override { return log ? "log_softmax" : "softmax"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("mask", mask);
    visit.saved("y", y);
  }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    softmax_backward(dx, y.grad(), y, mask, log);
  }
};

static Tensor softmax_op(const Tensor& x, const Tensor& mask, bool log) {
  check_float(log ? "log_softmax" : "softmax", x, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  softmax_forward(y, x, mask, log);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<SoftmaxNode>();
    node->log = log;
    node->x = x;
    node->y = y;
    node->mask = mask;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

Tensor softmax(const Tensor& x, const Tensor& mask) { return softmax_op(x, mask, false); }
Tensor log_softmax(const Tensor& x, const Tensor& mask) { return softmax_op(x, mask, true); }

}  // namespace cast::ops
