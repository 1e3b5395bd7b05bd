#include "ops/unary.h"

#include <algorithm>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "math/fast_math.h"
#include "ops/unary_cpu.h"
#ifdef CAST_WITH_CUDA
#include "cuda/unary.h"
#endif

namespace cast::ops {

namespace {
using unary_cpu::apply_cpu;
using unary_cpu::derivative_cpu;

// The loops over a range are plain functions with `omp simd`: written inline in an
// `omp parallel for` body, GCC left them scalar (the outlined region is not vectorised).
template <UnaryOp Op, class T>
void apply_range(T* y, const T* x, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) y[i] = apply_cpu<Op, T>(x[i]);
}

template <UnaryOp Op, class T>
void derivative_range(T* dx, const T* dy, const T* x, const T* y, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) dx[i] += dy[i] * derivative_cpu<Op, T>(x[i], y[i]);
}

// fn(begin, end) over [0, n) in chunks of 16384, in parallel when n is large
template <class Fn>
void in_chunks(int64_t n, Fn&& fn) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > 65536)
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// Runs body with the op fixed at compile time, so each loop is compiled (and vectorised) per op.
template <class Body>
void with_unary_op(UnaryOp op, Body&& body) {
  switch (op) {
    case UnaryOp::exp: return body(std::integral_constant<UnaryOp, UnaryOp::exp>{});
    case UnaryOp::log: return body(std::integral_constant<UnaryOp, UnaryOp::log>{});
    case UnaryOp::sqrt: return body(std::integral_constant<UnaryOp, UnaryOp::sqrt>{});
    case UnaryOp::relu: return body(std::integral_constant<UnaryOp, UnaryOp::relu>{});
    case UnaryOp::gelu: return body(std::integral_constant<UnaryOp, UnaryOp::gelu>{});
    case UnaryOp::sigmoid: return body(std::integral_constant<UnaryOp, UnaryOp::sigmoid>{});
    default: return body(std::integral_constant<UnaryOp, UnaryOp::laplace>{});
  }
}

}  // namespace

void unary_forward(Tensor& y, UnaryOp op, const Tensor& x) {
  check_float(unary_name(op), x, "x");
  check_same_shape(unary_name(op), y, x);
  CAST_ON_CUDA(x, cuda::unary_forward(y, op, x));
  CAST_DISPATCH_FLOAT(x.dtype(), unary_name(op), [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    with_unary_op(op, [&](auto fixed) {
      in_chunks(n, [&](int64_t begin, int64_t end) { apply_range<decltype(fixed)::value, T>(py, px, begin, end); });
    });
  });
}

void unary_backward(Tensor& dx, UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y) {
  CAST_ON_CUDA(x, cuda::unary_backward(dx, op, dy, x, y));
  CAST_DISPATCH_FLOAT(x.dtype(), unary_name(op), [&] {
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
    with_unary_op(op, [&](auto fixed) {
      in_chunks(n, [&](int64_t begin, int64_t end) {
        derivative_range<decltype(fixed)::value, T>(pdx, pdy, px, py, begin, end);
      });
    });
  });
}

struct UnaryNode final : autograd::Node {
  UnaryOp op;
  Tensor x;  // input, for derivatives written in x (log, relu, gelu, laplace)
  Tensor y;  // output, for derivatives written in y (exp, sqrt, sigmoid)
  const char* name() const override { return unary_name(op); }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.saved("y", y);
  }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    unary_backward(dx, op, y.grad(), x, y);
  }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  check_float(unary_name(op), x, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_forward(y, op, x);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<UnaryNode>();
    node->op = op;
    node->x = x;
    node->y = y;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
