#include "train/adamw.h"

#include <cmath>

#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/adamw.h"
#endif

namespace cast::train {

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& s) {
  check_float("adamw", param, "param");
  check_same_shape("adamw", param, grad);
  check_same_shape("adamw", param, m);
  check_same_shape("adamw", param, v);
  check_same_device("adamw", param, grad);
  const double c1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.t));
  const double c2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.t));
  CAST_ON_CUDA(param, cuda::adamw_update(param, grad, m, v, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, c1, c2));
  CAST_DISPATCH_FLOAT(param.dtype(), "adamw", [&] {
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    const int64_t n = param.numel();  // once: a call in the condition kept the loop scalar
    CAST_OMP("omp simd")
    for (int64_t i = 0; i < n; ++i) {
      pm[i] = static_cast<T>(s.beta1) * pm[i] + static_cast<T>(1 - s.beta1) * g[i];
      pv[i] = static_cast<T>(s.beta2) * pv[i] + static_cast<T>(1 - s.beta2) * g[i] * g[i];
      const T mhat = pm[i] / static_cast<T>(c1), vhat = pv[i] / static_cast<T>(c2);
      p[i] -= static_cast<T>(s.lr) *
              (mhat / (std::sqrt(vhat) + static_cast<T>(s.eps)) + static_cast<T>(s.weight_decay) * p[i]);
    }
  });
}

Tensor clip_factor(const Tensor& squared_norm, double max_norm) {
  check_float("clip_factor", squared_norm, "squared norm");
  CAST_CHECK(squared_norm.numel() == 1, "clip_factor: squared norm {} must hold one value", squared_norm.describe());
  Tensor factor = Tensor::empty({1}, squared_norm.dtype(), squared_norm.device());
  auto compute = [&] {
    CAST_ON_CUDA(squared_norm, cuda::clip_factor(factor, squared_norm, max_norm));
    const double f = clip_factor_of(squared_norm.item(), max_norm);
    CAST_DISPATCH_FLOAT(factor.dtype(), "clip_factor", [&] { factor.data<T>()[0] = static_cast<T>(f); });
  };
  compute();
  return factor;
}

}  // namespace cast::train
