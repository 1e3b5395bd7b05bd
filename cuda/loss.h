#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// count (1): the number of labelled rows, left on the device for the backward.
void cross_entropy_forward(Tensor& loss, Tensor& count, const Tensor& logp, const Tensor& labels, int64_t rows,
                           int64_t classes);
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            const Tensor& count, int64_t rows, int64_t classes);
// correct (1) = rows whose top class (math/topk_order.h) equals their label.
void correct_predictions(Tensor& correct, const Tensor& logits, const Tensor& labels, int64_t rows, int64_t classes);
}  // namespace cast::cuda
