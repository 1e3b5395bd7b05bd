#include "ops/layernorm.h"

#include <omp.h>

#include <cmath>
#include <vector>
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

// ---------------------------------------------------------------- CPU rows
// Each row is a plain function with `omp simd` loops and raw pointers, so it vectorises.
template <class T>
static void layernorm_row(T* y, T& mean, T& rstd, const T* x, const T* gamma, const T* beta, int64_t d, T eps) {
  T mu = 0, var = 0;
#pragma omp simd reduction(+ : mu)
  for (int64_t j = 0; j < d; ++j) mu += x[j];
  mu /= static_cast<T>(d);
#pragma omp simd reduction(+ : var)
  for (int64_t j = 0; j < d; ++j) var += (x[j] - mu) * (x[j] - mu);
  const T rs = T(1) / std::sqrt(var / static_cast<T>(d) + eps);
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) y[j] = (x[j] - mu) * rs * gamma[j] + beta[j];
  mean = mu;
  rstd = rs;
}

// dx += rstd (dy γ − mean(dy γ) − x̂ mean(dy γ x̂)); dgamma += dy x̂ and dbeta += dy (either may be null)
template <class T>
static void layernorm_row_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* gamma, T mu, T rs,
                                   int64_t d) {
  T mean_g = 0, mean_gx = 0;
#pragma omp simd reduction(+ : mean_g, mean_gx)
  for (int64_t j = 0; j < d; ++j) {
    const T xhat = (x[j] - mu) * rs;
    mean_g += dy[j] * gamma[j];
    mean_gx += dy[j] * gamma[j] * xhat;
  }
  mean_g /= static_cast<T>(d);
  mean_gx /= static_cast<T>(d);
  if (dgamma)
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) dgamma[j] += dy[j] * (x[j] - mu) * rs;
  if (dbeta)
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) dbeta[j] += dy[j];
  if (dx)
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) dx[j] += rs * (dy[j] * gamma[j] - mean_g - (x[j] - mu) * rs * mean_gx);
}

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       double eps) {
  const int64_t d = check_layernorm(x, gamma, beta);
  const int64_t rows = x.numel() / d;
  CAST_ON_CUDA(x, cuda::layernorm_forward(y, mean, rstd, x, gamma, beta, rows, d, eps));
  CAST_DISPATCH_FLOAT(x.dtype(), "layernorm", [&] {
    const T *px = x.data<T>(), *pg = gamma.data<T>(), *pb = beta.data<T>();
    T *py = y.data<T>(), *pm = mean.data<T>(), *pr = rstd.data<T>();
    CAST_OMP("omp parallel for if (rows * d > 16384)")
    for (int64_t r = 0; r < rows; ++r)
      layernorm_row(py + r * d, pm[r], pr[r], px + r * d, pg, pb, d, static_cast<T>(eps));
  });
}

void layernorm_backward(Tensor* dx, Tensor* dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                        const Tensor& gamma, const Tensor& mean, const Tensor& rstd) {
  const int64_t d = x.dim(-1), rows = x.numel() / d;
  CAST_ON_CUDA(x, cuda::layernorm_backward(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, rows, d));
  CAST_DISPATCH_FLOAT(x.dtype(), "layernorm", [&] {
    const T *px = x.data<T>(), *pg = gamma.data<T>(), *pdy = dy.data<T>();
    const T *pm = mean.data<T>(), *pr = rstd.data<T>();
    T* pdx = dx ? dx->data<T>() : nullptr;
    // The parameter gradients sum over rows: each thread sums its own block of rows, and the
    // partial sums are added in thread order afterwards, so the result does not depend on
    // which thread finished first (resumed runs stay bit-identical).
    const int threads = rows * d > 16384 ? omp_get_max_threads() : 1;
    std::vector<T> partial_g(dgamma ? threads * d : 0, T(0)), partial_b(dbeta ? threads * d : 0, T(0));
    CAST_OMP("omp parallel num_threads(threads)")
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      T* pg_t = dgamma ? partial_g.data() + t * d : nullptr;
      T* pb_t = dbeta ? partial_b.data() + t * d : nullptr;
      const int64_t begin = rows * t / nt, end = rows * (t + 1) / nt;
      for (int64_t r = begin; r < end; ++r)
        layernorm_row_backward(pdx ? pdx + r * d : nullptr, pg_t, pb_t, pdy + r * d, px + r * d, pg, pm[r], pr[r], d);
    }
    for (int t = 0; t < threads; ++t)
      for (int64_t j = 0; j < d; ++j) {
        if (dgamma) dgamma->data<T>()[j] += partial_g[t * d + j];
        if (dbeta) dbeta->data<T>()[j] += partial_b[t * d + j];
      }
  });
}

struct LayerNormNode final : autograd::Node {
  Tensor x, gamma, beta;  // inputs
  Tensor mean, rstd;      // saved per-row statistics: (rows)
  const char* name() const override { return "layernorm"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("gamma", gamma);
    visit.input("beta", beta);
    visit.saved("mean", mean);
    visit.saved("rstd", rstd);
  }
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
