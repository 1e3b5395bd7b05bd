#pragma once
// Sum and mean over one axis.
#include "math/sum_order.h"
#include "tensor/tensor.h"

namespace cast::ops {

// x viewed as (outer, n, inner); y: (outer, inner) = scale * sum over n. With inner > 1 (a
// column sum, e.g. a bias gradient) the rows are summed in the order of math/sum_order.h, the same
// on both devices.
void sum_axis_forward(Tensor& y, const Tensor& x, int axis, double scale);
// dx[o, j, i] += scale * dy[o, i]
void sum_axis_backward(Tensor& dx, const Tensor& dy, int axis, double scale);

Tensor sum(const Tensor& x, int axis, bool keepdim = false);
Tensor mean(const Tensor& x, int axis, bool keepdim = false);
Tensor sum_all(const Tensor& x);  // one-element tensor of shape {1}
Tensor mean_all(const Tensor& x);

// Sum over `axis` keeping it as size 1; no autograd (used by backward passes).
Tensor sum_axis_raw(const Tensor& x, int axis);

// The (outer, n, inner) split of a shape around an axis.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisSplit split_at_axis(const Shape& s, int axis);

}  // namespace cast::ops
