#include "ops/reduce.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/layout.h"
#ifdef CAST_WITH_CUDA
#include "cuda/reduce.h"
#endif

namespace cast::ops {

AxisSplit split_at_axis(const Shape& s, int axis) {
  AxisSplit r;
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.n = s[i];
    else r.inner *= s[i];
  }
  return r;
}

template <class T>
static T row_sum(const T* x, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}

void sum_axis_forward(Tensor& y, const Tensor& x, int axis, double scale) {
  check_float("sum", x, "x");
  axis = normalize_axis("sum", axis, x.ndim());
  AxisSplit p = split_at_axis(x.shape(), axis);
  CAST_CHECK(y.numel() == p.outer * p.inner, "sum: output {} does not fit input {} reduced over axis {}", y.describe(),
             x.describe(), axis);
  CAST_ON_CUDA(x, cuda::sum_axis_forward(y, x, p.outer, p.n, p.inner, scale));
  CAST_DISPATCH_FLOAT(x.dtype(), "sum", [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    if (p.inner == 1) {  // a sum along contiguous rows: its own vectorised loop
      CAST_OMP("omp parallel for if (p.outer * p.n > 65536)")
      for (int64_t o = 0; o < p.outer; ++o) py[o] = row_sum(px + o * p.n, p.n) * static_cast<T>(scale);
      return;
    }
    // stage 1: each chunk of rows summed from 0, in row order (one chunk: the whole sum)
    const int64_t chunks = (p.n + kSumChunk - 1) / kSumChunk;
    std::vector<T> partial(chunks > 1 ? p.outer * chunks * p.inner : 0);
    T* out = chunks > 1 ? partial.data() : py;
    CAST_OMP("omp parallel for if (p.outer * p.n * p.inner > 65536)")
    for (int64_t oc = 0; oc < p.outer * std::max<int64_t>(chunks, 1); ++oc) {
      const int64_t o = oc / std::max<int64_t>(chunks, 1), c = oc % std::max<int64_t>(chunks, 1);
      T* s = out + oc * p.inner;
      for (int64_t i = 0; i < p.inner; ++i) s[i] = 0;
      for (int64_t j = c * kSumChunk; j < std::min(p.n, (c + 1) * kSumChunk); ++j)
        for (int64_t i = 0; i < p.inner; ++i) s[i] += px[(o * p.n + j) * p.inner + i];
    }
    // stage 2: the chunk sums, in chunk order
    if (chunks > 1)
      for (int64_t o = 0; o < p.outer; ++o)
        for (int64_t i = 0; i < p.inner; ++i) {
          T s = 0;
          for (int64_t c = 0; c < chunks; ++c) s += partial[(o * chunks + c) * p.inner + i];
          py[o * p.inner + i] = s;
        }
    for (int64_t o = 0; o < p.outer * p.inner; ++o) py[o] *= static_cast<T>(scale);
  });
}

void sum_axis_backward(Tensor& dx, const Tensor& dy, int axis, double scale) {
  axis = normalize_axis("sum", axis, dx.ndim());
  AxisSplit p = split_at_axis(dx.shape(), axis);
  CAST_ON_CUDA(dx, cuda::sum_axis_backward(dx, dy, p.outer, p.n, p.inner, scale));
  CAST_DISPATCH_FLOAT(dx.dtype(), "sum", [&] {
    T* pdx = dx.data<T>();
    const T* pdy = dy.data<T>();
    CAST_OMP("omp parallel for if (dx.numel() > 65536)")
    for (int64_t o = 0; o < p.outer; ++o)
      for (int64_t j = 0; j < p.n; ++j)
        for (int64_t i = 0; i < p.inner; ++i)
          pdx[(o * p.n + j) * p.inner + i] += static_cast<T>(scale) * pdy[o * p.inner + i];
  });
}

struct SumNode final : autograd::Node {
  int axis = 0;
  double scale = 1.0;  // 1 for sum, 1/n for mean
  Tensor x;            // input; only its shape matters
  const char* name() const override { return "sum"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    sum_axis_backward(dx, outputs[0].grad(), axis, scale);
  }
};

static Tensor reduce(const Tensor& x, int axis, bool keepdim, bool is_mean) {
  check_float(is_mean ? "mean" : "sum", x, "x");
  axis = normalize_axis(is_mean ? "mean" : "sum", axis, x.ndim());
  Shape shape = x.shape();
  double scale = is_mean ? 1.0 / static_cast<double>(std::max<int64_t>(1, shape[axis])) : 1.0;
  if (keepdim) shape[axis] = 1;
  else shape.erase(shape.begin() + axis);
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  sum_axis_forward(y, x, axis, scale);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<SumNode>();
    node->axis = axis;
    node->scale = scale;
    node->x = x;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

Tensor sum(const Tensor& x, int axis, bool keepdim) { return reduce(x, axis, keepdim, false); }
Tensor mean(const Tensor& x, int axis, bool keepdim) { return reduce(x, axis, keepdim, true); }

Tensor sum_all(const Tensor& x) { return reduce(reshape(x, {x.numel()}), 0, true, false); }
Tensor mean_all(const Tensor& x) { return reduce(reshape(x, {x.numel()}), 0, true, true); }

Tensor sum_axis_raw(const Tensor& x, int axis) {
  Shape shape = x.shape();
  shape[normalize_axis("sum", axis, x.ndim())] = 1;
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  sum_axis_forward(y, x, axis, 1.0);
  return y;
}

}  // namespace cast::ops
