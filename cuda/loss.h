#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// Returns the number of labelled rows (labels >= 0).
int64_t cross_entropy_forward(Tensor& loss, const Tensor& logp, const Tensor& labels, int64_t rows, int64_t classes);
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            int64_t rows, int64_t classes, int64_t count);
}  // namespace cast::cuda
