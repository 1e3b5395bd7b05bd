#pragma once
// Recomputation: a piece of the forward that keeps only its input for the backward. The caller
// runs the piece on x without recording it (NoGradGuard) and hands its output to
// recompute_in_backward(), which records one node that keeps x alone. That node's backward runs
// `body` (the same piece) again on a tape of its own (SeparateTape), walks that tape back and
// hands x its gradient. So what the body's ops keep for their backward lives during this node's backward
// only: memory for one more forward of the body in each backward. A Transformer block run this
// way (`--recompute`) keeps its input alone from the forward to the backward.
//
// `body` must give the same values both times: it runs the same ops on the same input, and it
// restores any state it draws from (dropout's counter, LSH's draws) itself. `parameters` are
// the leaves the body reads that may need a gradient: the second run adds into their gradients,
// as the body's own nodes would have.
#include <functional>
#include <vector>

#include "tensor/tensor.h"

namespace cast::autograd {

// Returns `out`, recorded as the node's output where x or a parameter needs a gradient.
Tensor recompute_in_backward(const char* name, const Tensor& x, const Tensor& out,
                             const std::vector<const Tensor*>& parameters, std::function<Tensor(const Tensor&)> body);

// A leaf over t's storage for a separate tape: its gradient is gathered apart from t's. An
// undefined t, or one that needs no gradient, is returned as it is.
Tensor leaf_over(const Tensor& t);
// t's gradient += the leaf's (the leaf's buffer changes hands where t has none yet).
void take_gradient(Tensor& t, const Tensor& leaf);

}  // namespace cast::autograd
