#include "ops/dropout.h"

#include <algorithm>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "tensor/philox.h"
#ifdef CAST_WITH_CUDA
#include "cuda/dropout.h"
#endif

namespace cast::ops {

// y = base + x ⊙ keep / (1 − p), written once for forward (x) and backward (dy): base is y itself
// where the gradient is added into (accumulate), the residual's stream for dropout_add, else 0.
// keep_i is philox::uniform(seed, offset + i) >= p, the CUDA kernel's test; the words come
// kChunk at a time from philox::first_words, which vectorises.
static void apply_mask(Tensor& y, const Tensor& x, double p, uint64_t seed, uint64_t offset, bool accumulate,
                       const Tensor& residual = Tensor()) {
  CAST_ON_CUDA(x, cuda::dropout(y, x, p, seed, offset, accumulate, residual));
  CAST_DISPATCH_FLOAT(x.dtype(), "dropout", [&] {
    constexpr int64_t kChunk = 1024;
    const T* px = x.data<T>();
    const T* pr = residual.defined() ? residual.data<T>() : nullptr;
    T* py = y.data<T>();
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const uint32_t threshold = philox::unit_threshold(p);
    const int64_t n = x.numel();
    CAST_OMP("omp parallel for if (n > 65536)")
    for (int64_t start = 0; start < n; start += kChunk) {
      uint32_t words[kChunk];
      const int64_t len = std::min(kChunk, n - start);
      philox::first_words(seed, offset + static_cast<uint64_t>(start), len, words);
      const T* xs = px + start;
      T* ys = py + start;
      if (accumulate) {
        for (int64_t j = 0; j < len; ++j) ys[j] += philox::unit_at_least(words[j], threshold) ? xs[j] * scale : T(0);
      } else if (pr) {
        const T* rs = pr + start;
        for (int64_t j = 0; j < len; ++j)
          ys[j] = rs[j] + (philox::unit_at_least(words[j], threshold) ? xs[j] * scale : T(0));
      } else {
        for (int64_t j = 0; j < len; ++j) ys[j] = philox::unit_at_least(words[j], threshold) ? xs[j] * scale : T(0);
      }
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

// ---------------------------------------------------------------- x + dropout(t)
void dropout_add_forward(Tensor& y, const Tensor& x, const Tensor& t, double p, uint64_t seed, uint64_t offset) {
  check_float("dropout_add", t, "t");
  check_same_dtype("dropout_add", t, x);
  check_same_shape("dropout_add", x, t);
  check_same_shape("dropout_add", y, t);
  CAST_CHECK(x.device() == t.device() && y.device() == t.device(), "dropout_add: {}, {} and {} on different devices",
             y.describe(), x.describe(), t.describe());
  CAST_CHECK(p >= 0.0 && p < 1.0, "dropout_add: p must be in [0, 1), got {}", p);
  apply_mask(y, t, p, seed, offset, false, x);
}

struct DropoutAddNode final : autograd::Node {
  double p = 0.0;
  uint64_t seed = 0, offset = 0;  // the mask is a function of these: nothing else is saved
  Tensor x, t;                    // inputs; only their places on the tape, for the gradients
  const char* name() const override { return "dropout_add"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("t", t);
  }
  bool backward_reads_outputs() const override { return false; }
  // dt first, written where t has no gradient yet; then x takes dy's own buffer (the residual
  // stream's, which nobody reads once this node has run), or adds it where it cannot. With t = x
  // the sums come in the reference's order, x's dy before the mask's: (g + dy) + mask(dy).
  void backward() override {
    if (t.same_as(x)) {
      if (!x.requires_grad()) return;
      autograd::accumulate(x, outputs[0].grad());
      bool fresh = false;
      Tensor dx = x.grad_buffer(&fresh);
      apply_mask(dx, outputs[0].grad(), p, seed, offset, true);
      return;
    }
    if (t.requires_grad()) {
      bool fresh = false;
      Tensor dt = t.grad_buffer(&fresh);
      apply_mask(dt, outputs[0].grad(), p, seed, offset, !fresh);
    }
    if (x.requires_grad() && !autograd::pass_gradient(x, outputs[0])) autograd::accumulate(x, outputs[0].grad());
  }
};

Tensor dropout_add(const Tensor& x, const Tensor& t, double p, uint64_t seed, uint64_t offset) {
  Tensor y = Tensor::empty(t.shape(), t.dtype(), t.device());
  dropout_add_forward(y, x, t, p, seed, offset);
  if (autograd::needs_grad({&x, &t})) {
    auto node = std::make_unique<DropoutAddNode>();
    node->p = p;
    node->seed = seed;
    node->offset = offset;
    node->x = x;
    node->t = t;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
