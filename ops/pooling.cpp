#include "ops/pooling.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/pooling.h"
#endif

namespace cast::ops {

static void check_pool(const Tensor& x, const Tensor& mask) {
  check_float("masked_mean", x, "x");
  check_ndim("masked_mean", x, 3, "x");
  check_same_dtype("masked_mean", x, mask);
  check_same_device("masked_mean", x, mask);
  CAST_CHECK(mask.shape() == (Shape{x.dim(0), x.dim(1)}), "masked_mean: mask {} must be [{}, {}] for x {}",
             mask.describe(), x.dim(0), x.dim(1), x.describe());
}

// The weight of token n in sequence b: mask / (number of real tokens), 0 for an empty sequence.
template <class T>
static T token_weight(const T* mask_row, int64_t n_tokens, int64_t n) {
  T count = 0;
  for (int64_t j = 0; j < n_tokens; ++j) count += mask_row[j];
  return count > T(0) ? mask_row[n] / count : T(0);
}

void masked_mean_forward(Tensor& y, const Tensor& x, const Tensor& mask) {
  check_pool(x, mask);
  const int64_t B = x.dim(0), N = x.dim(1), D = x.dim(2);
  CAST_ON_CUDA(x, cuda::masked_mean_forward(y, x, mask, B, N, D));
  CAST_DISPATCH_FLOAT(x.dtype(), "masked_mean", [&] {
    for (int64_t b = 0; b < B; ++b) {
      T* yr = y.data<T>() + b * D;
      for (int64_t j = 0; j < D; ++j) yr[j] = 0;
      const T* m = mask.data<T>() + b * N;
      for (int64_t n = 0; n < N; ++n) {
        const T w = token_weight(m, N, n);
        const T* xr = x.data<T>() + (b * N + n) * D;
        for (int64_t j = 0; j < D; ++j) yr[j] += w * xr[j];
      }
    }
  });
}

void masked_mean_backward(Tensor& dx, const Tensor& dy, const Tensor& mask) {
  const int64_t B = dx.dim(0), N = dx.dim(1), D = dx.dim(2);
  CAST_ON_CUDA(dx, cuda::masked_mean_backward(dx, dy, mask, B, N, D));
  CAST_DISPATCH_FLOAT(dx.dtype(), "masked_mean", [&] {
    for (int64_t b = 0; b < B; ++b) {
      const T* m = mask.data<T>() + b * N;
      for (int64_t n = 0; n < N; ++n) {
        const T w = token_weight(m, N, n);
        T* dr = dx.data<T>() + (b * N + n) * D;
        for (int64_t j = 0; j < D; ++j) dr[j] += w * dy.data<T>()[b * D + j];
      }
    }
  });
}

struct MaskedMeanNode final : autograd::Node {
  Tensor x;     // (B, N, D)
  Tensor mask;  // (B, N), a constant
  const char* name() const override { return "masked_mean"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("mask", mask);
  }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    masked_mean_backward(dx, outputs[0].grad(), mask);
  }
};

Tensor masked_mean(const Tensor& x, const Tensor& mask) {
  check_pool(x, mask);
  Tensor y = Tensor::empty({x.dim(0), x.dim(2)}, x.dtype(), x.device());
  masked_mean_forward(y, x, mask);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<MaskedMeanNode>();
    node->x = x;
    node->mask = mask;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
