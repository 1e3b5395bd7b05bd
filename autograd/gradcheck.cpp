#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/tape.h"

namespace cast::autograd {

static double weighted_sum(const Tensor& out, const Tensor& weights) {
  const double* o = out.data<double>();
  const double* w = weights.data<double>();
  double s = 0;
  for (int64_t i = 0; i < out.numel(); ++i) s += o[i] * w[i];
  return s;
}

GradCheckResult gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, double eps, double tolerance) {
  for (const Tensor& t : inputs)
    CAST_CHECK(t.device() == Device::cpu && (t.dtype() == DType::f64 || !t.requires_grad()),
               "gradcheck: differentiable inputs must be f64 CPU tensors, got {}", t.describe());
  clear_tape();
  for (Tensor t : inputs)
    if (t.requires_grad()) t.reset_grad();

  // Analytic gradients of L = Σ out ⊙ R.
  Tensor out = fn(inputs);
  CAST_CHECK(out.dtype() == DType::f64, "gradcheck: the function must return f64, got {}", out.describe());
  const Tensor weights = Tensor::uniform(out.shape(), 12345, 0, -1.0, 1.0, DType::f64);
  backward(out, weights);  // the gradient of Σ out ⊙ R is R at the output

  GradCheckResult result;
  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor x = inputs[i];
    if (!x.requires_grad()) continue;
    Tensor analytic = x.grad().defined() ? x.grad() : Tensor::zeros(x.shape(), DType::f64);
    double* px = x.data<double>();
    double diff2 = 0, num2 = 0, ana2 = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double saved = px[j];
      px[j] = saved + eps;
      const double plus = weighted_sum(fn(inputs), weights);
      px[j] = saved - eps;
      const double minus = weighted_sum(fn(inputs), weights);
      px[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double a = analytic.data<double>()[j];
      diff2 += (a - numeric) * (a - numeric);
      num2 += numeric * numeric;
      ana2 += a * a;
    }
    const double err = std::sqrt(diff2) / std::max({std::sqrt(num2), std::sqrt(ana2), 1e-12});
    result.max_error = std::max(result.max_error, err);
    if (err > tolerance) result.ok = false;
    result.report +=
        fmt::format("input {} {}: relative error {:.3e} (|grad| {:.3e})\n", i, x.describe(), err, std::sqrt(num2));
  }
  return result;
}

}  // namespace cast::autograd
