#include "ops/layernorm.h"

#include <cmath>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/layernorm.h"
#endif

namespace cast::ops {

static int64_t check_layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  check_float("layernorm", x, "x");
  check_same_dtype("layernorm", x, gamma);
  check_same_dtype("layernorm", x, beta);
  check_same_device("layernorm", x, gamma);
  check_same_device("layernorm", x, beta);
  const int64_t d = x.dim(-1);
  CAST_CHECK(gamma.shape() == Shape{d} && beta.shape() == Shape{d},
             "layernorm: gamma {} and beta {} must be [{}] for x {}", gamma.describe(), beta.describe(), d,
             x.describe());
  return d;
}

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                       const Tensor& beta, double eps) {
  const int64_t d = check_layernorm(x, gamma, beta);
  const int64_t rows = x.numel() / d;
  CAST_ON_CUDA(x, cuda::layernorm_forward(y, mean, rstd, x, gamma, beta, rows, d, eps));
  CAST_DISPATCH_FLOAT(x.dtype(), "layernorm", [&] {
_Pragma("omp parallel for if (rows * d > 16384)")
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      T* yr = y.data<T>() + r * d;
      T mu = 0, var = 0;
      for (int64_t j = 0; j < d; ++j) mu += xr[j];
      mu /= static_cast<T>(d);
      for (int64_t j = 0; j < d; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      T rs = T(1) / std::sqrt(var / static_cast<T>(d) + static_cast<T>(eps));
      for (int64_t j = 0; j < d; ++j) yr[j] = (xr[j] - mu) * rs * gamma.data<T>()[j] + beta.data<T>()[j];
      mean.data<T>()[r] = mu;
      rstd.data<T>()[r] = rs;
    }
  });
}

void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  CAST_ON_CUDA(x, cuda::layernorm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, rows, d));
  CAST_DISPATCH_FLOAT(x.dtype(), "layernorm", [&] {
    const T* g = gamma.data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data<T>() + r * d;
      const T* gr = dy.data<T>() + r * d;
      const T mu = mean.data<T>()[r], rs = rstd.data<T>()[r];
      T mean_g = 0, mean_gx = 0;  // means of dxhat and dxhat·xhat
      for (int64_t j = 0; j < d; ++j) {
        T xhat = (xr[j] - mu) * rs;
        mean_g += gr[j] * g[j];
        mean_gx += gr[j] * g[j] * xhat;
        if (dgamma) dgamma->data<T>()[j] += gr[j] * xhat;
        if (dbeta) dbeta->data<T>()[j] += gr[j];
      }
      mean_g /= static_cast<T>(d);
      mean_gx /= static_cast<T>(d);
      if (!dx) continue;
      T* dr = dx->data<T>() + r * d;
      for (int64_t j = 0; j < d; ++j) {
        T xhat = (xr[j] - mu) * rs;
        dr[j] += rs * (gr[j] * g[j] - mean_g - xhat * mean_gx);
      }
    }
  });
}

struct LayerNormNode final : autograd::Node {
  Tensor x, gamma, beta;  // inputs
  Tensor mean, rstd;      // saved per-row statistics: (rows)
  const char* name() const override { return "layernorm"; }
  void backward() override {
    Tensor dx = x.requires_grad() ? x.grad_accumulator() : Tensor();
    Tensor dg = gamma.requires_grad() ? gamma.grad_accumulator() : Tensor();
    Tensor db = beta.requires_grad() ? beta.grad_accumulator() : Tensor();
    layernorm_backward(dx.defined() ? &dx : nullptr, dg.defined() ? &dg : nullptr, db.defined() ? &db : nullptr,
                       outputs[0].grad(), x, gamma, mean, rstd);
  }
};

Tensor layernorm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  const int64_t d = check_layernorm(x, gamma, beta);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({x.numel() / d}, x.dtype(), x.device());
  Tensor rstd = Tensor::empty({x.numel() / d}, x.dtype(), x.device());
  layernorm_forward(y, mean, rstd, x, gamma, beta, eps);
  if (autograd::needs_grad({&x, &gamma, &beta})) {
    auto node = std::make_unique<LayerNormNode>();
    node->x = x;
    node->gamma = gamma;
    node->beta = beta;
    node->mean = mean;
    node->rstd = rstd;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
