#pragma once
// Cross-entropy with integer labels, averaged over the labelled rows (label < 0 = ignored).
#include "tensor/tensor.h"

namespace cast::ops {

// logits: (R, C), labels: (R) int -> loss: (1); logp: (R, C) log-probabilities saved for backward;
// count: (1) the number of labelled rows, a tensor where the logits are (on a GPU it is never
// copied back: the backward reads it there).
void cross_entropy_forward(Tensor& loss, Tensor& logp, Tensor& count, const Tensor& logits, const Tensor& labels);
// dlogits += dloss / count · (softmax − onehot); nothing when count is 0
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            const Tensor& count);

Tensor cross_entropy(const Tensor& logits, const Tensor& labels);

// How many rows' top class (the order of top-k: math/topk_order.h) equals their label: logits
// (R, C), labels (R) -> (1) of the logits' dtype, where the logits are. No gradient.
Tensor correct_predictions(const Tensor& logits, const Tensor& labels);

}  // namespace cast::ops
