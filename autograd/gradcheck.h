#pragma once
// Finite-difference gradient check in double precision.
//
// The function's output is reduced to a scalar L = Σ out ⊙ R with a fixed random R, so every
// output element matters. For each input that requires grad, the gradient from backward() is
// compared with central differences (L(x + ε) − L(x − ε)) / 2ε, element by element.
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace cast::autograd {

struct GradCheckResult {
  bool ok = true;
  double max_error = 0.0;  // largest relative error over the checked inputs
  std::string report;      // one line per input
};

using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs must be f64 CPU tensors; the ones that require grad are checked.
// Relative error of an input = ‖analytic − numeric‖₂ / max(‖numeric‖₂, ‖analytic‖₂, 1e-12).
GradCheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, double eps = 1e-6,
                          double tolerance = 1e-6);

}  // namespace cast::autograd
