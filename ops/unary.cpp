#include "ops/unary.h"

#include <algorithm>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/fast_math.h"
#ifdef CAST_WITH_CUDA
#include "cuda/unary.h"
#endif

namespace cast::ops {

// ---------------------------------------------------------------- CPU f32 forms
// std::erfc and std::exp stay scalar library calls, and GELU's Φ took a sixth of a small
// model's training step. In f32 the CPU uses forms the compiler vectorises: erfc from a
// Chebyshev fit (relative error below 1.2e−7 for every u, Numerical Recipes' erfcc) and
// exp_nonpositive. f64 (the gradient checks) and CUDA keep ops/unary_math.h.
namespace {

inline float erfc_f32(float u) {
  const float a = u < 0 ? -u : u;
  const float t = 1.0f / (1.0f + 0.5f * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float r = t * exp_nonpositive(-a * a + p);
  return u >= 0 ? r : 2.0f - r;
}

inline float normal_cdf_f32(float z) { return 0.5f * erfc_f32(-z * static_cast<float>(kInvSqrt2)); }
inline float gaussian_f32(float z) { return static_cast<float>(kInvSqrt2Pi) * exp_nonpositive(-0.5f * z * z); }

// The op is a template parameter: each loop below is compiled for one function, inlined.
template <UnaryOp Op, class T>
inline T apply_cpu(T x) {
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::gelu) {
    return x * normal_cdf_f32(x);
  } else if constexpr (std::is_same_v<T, float> && Op == UnaryOp::laplace) {
    return normal_cdf_f32((x - static_cast<float>(kLaplaceMu)) / static_cast<float>(kLaplaceSigma));
  } else if constexpr (std::is_same_v<T, float> && Op == UnaryOp::sigmoid) {
    const float e = exp_nonpositive(x < 0 ? x : -x);  // exp(−|x|): no overflow either side
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  } else {
    return unary_apply(Op, x);
  }
}

template <UnaryOp Op, class T>
inline T derivative_cpu(T x, T y) {
  if constexpr (std::is_same_v<T, float> && Op == UnaryOp::gelu) {
    return normal_cdf_f32(x) + x * gaussian_f32(x);
  } else if constexpr (std::is_same_v<T, float> && Op == UnaryOp::laplace) {
    return gaussian_f32((x - static_cast<float>(kLaplaceMu)) / static_cast<float>(kLaplaceSigma)) /
           static_cast<float>(kLaplaceSigma);
  } else {
    return unary_derivative(Op, x, y);
  }
}

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
