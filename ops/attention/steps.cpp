#include "ops/attention/steps.h"

#include <cmath>
#include <vector>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/ops.h"

namespace cast::ops {

// ---------------------------------------------------------------- helpers
Tensor constant_like(const std::vector<double>& values, const Shape& shape, const Tensor& like) {
  return Tensor::from_vector<double>(values, shape).to(like.dtype()).to(like.device());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return add(x, Tensor::zeros(shape, x.dtype(), x.device()));
}

}  // namespace cast::ops
