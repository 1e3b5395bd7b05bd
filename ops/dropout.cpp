#include "ops/dropout.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "tensor/philox.h"
#ifdef CAST_WITH_CUDA
#include "cuda/dropout.h"
#endif

namespace cast::ops {

// y = x ⊙ keep / (1 − p), written once for forward (x) and backward (dy, accumulating).
static void apply_mask(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset, bool accumulate) {
  CAST_ON_CUDA(x, cuda::dropout(y, x, p, seed, offset, accumulate));
  CAST_DISPATCH_FLOAT(x.dtype(), "dropout", [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const int64_t n = x.numel();
    CAST_OMP("omp parallel for if (n > 65536)")
    for (int64_t i = 0; i < n; ++i) {
      T v = philox::uniform(seed, offset + i) >= p ? px[i] * scale : T(0);
      py[i] = accumulate ? py[i] + v : v;
    }
  });
}

void dropout_forward(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  check_float("dropout", x, "x");
  check_same_shape("dropout", y, x);
  CAST_CHECK(p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got {}", p);
  apply_mask(y, x, p, seed, offset, false);
}

void dropout_backward(Tensor& dx, const Tensor& dy, double p, uint64_t seed, uint64_t offset) {
  apply_mask(dx, dy, p, seed, offset, true);
}

struct DropoutNode final : autograd::Node {
  double p = 0.0;
  uint64_t seed = 0, offset = 0;  // the mask is a function of these: nothing else is saved
  Tensor x;
  const char* name() const override { return "dropout"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    dropout_backward(dx, outputs[0].grad(), p, seed, offset);
  }
};

Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset) {
  if (p == 0.0) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  dropout_forward(y, x, p, seed, offset);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<DropoutNode>();
    node->p = p;
    node->seed = seed;
    node->offset = offset;
    node->x = x;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
