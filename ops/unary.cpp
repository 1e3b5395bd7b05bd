#include "ops/unary.h"

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
  for (float c : {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f, 0.09678418f, 0.37409196f,
                  1.00002368f, -1.26551223f})
    p = p * t + c;
  const float r = t * exp_nonpositive(-a * a + p);
  return u >= 0 ? r : 2.0f - r;
}

inline float normal_cdf_f32(float z) { return 0.5f * erfc_f32(-z * static_cast<float>(kInvSqrt2)); }
inline float gaussian_f32(float z) { return static_cast<float>(kInvSqrt2Pi) * exp_nonpositive(-0.5f * z * z); }

template <class T>
inline T apply_cpu(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case UnaryOp::gelu: return x * normal_cdf_f32(x);
      case UnaryOp::laplace: return normal_cdf_f32((x - static_cast<float>(kLaplaceMu)) / static_cast<float>(kLaplaceSigma));
      case UnaryOp::sigmoid: {
        const float e = exp_nonpositive(x < 0 ? x : -x);  // exp(−|x|): no overflow either side
        return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
      }
      default: break;
    }
  }
  return unary_apply(op, x);
}

template <class T>
inline T derivative_cpu(UnaryOp op, T x, T y) {
  if constexpr (std::is_same_v<T, float>) {
    switch (op) {
      case UnaryOp::gelu: return normal_cdf_f32(x) + x * gaussian_f32(x);
      case UnaryOp::laplace:
        return gaussian_f32((x - static_cast<float>(kLaplaceMu)) / static_cast<float>(kLaplaceSigma)) /
               static_cast<float>(kLaplaceSigma);
      default: break;
    }
  }
  return unary_derivative(op, x, y);
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
_Pragma("omp parallel for simd if (n > 65536)")
      for (int64_t i = 0; i < n; ++i) py[i] = apply_cpu<T>(fixed.value, px[i]);
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
_Pragma("omp parallel for simd if (n > 65536)")
      for (int64_t i = 0; i < n; ++i) pdx[i] += pdy[i] * derivative_cpu<T>(fixed.value, px[i], py[i]);
    });
  });
}

struct UnaryNode final : autograd::Node {
  UnaryOp op;
  Tensor x;  // input, for derivatives written in x (log, relu, gelu, laplace)
  Tensor y;  // output, for derivatives written in y (exp, sqrt, sigmoid)
  const char* name() const override { return unary_name(op); }
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
