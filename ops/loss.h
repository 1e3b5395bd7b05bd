#pragma once
// Cross-entropy with integer labels, averaged over the labelled rows (label < 0 = ignored).
#include "tensor/tensor.h"

namespace cast::ops {

// logits: (R, C), labels: (R) int -> loss: (1); logp: (R, C) log-probabilities saved for backward;
// count: the number of labelled rows.
void cross_entropy_forward(Tensor& loss, Tensor& logp, int64_t& count, const Tensor& logits, const Tensor& labels);
// dlogits += dloss / count · (softmax − onehot)
void cross_entropy_backward(Tensor& dlogits, const Tensor& dloss, const Tensor& logp, const Tensor& labels,
                            int64_t count);

Tensor cross_entropy(const Tensor& logits, const Tensor& labels);

}  // namespace cast::ops
