#pragma once
// Elementwise functions and their derivatives, written once for the CPU and CUDA kernels.
// derivative(x, y) receives the input x and the output y = f(x), whichever is cheaper to use.
#include <cmath>

#include "tensor/hd.h"

namespace cast {

enum class UnaryOp : int { exp, log, sqrt, relu, gelu, sigmoid, laplace };

// Laplace attention function (ATTENTION.md, step 2): Φ((x − μ)/σ), μ = √½, σ = √(1/(4π)).
constexpr double kLaplaceMu = 0.70710678118654752440;
constexpr double kLaplaceSigma = 0.28209479177387814347;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// Standard normal CDF.
template <class T>
CAST_HD T normal_cdf(T z) {
  return T(0.5) * erfc(-z * T(kInvSqrt2));
}

template <class T>
CAST_HD T unary_apply(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::exp: return exp(x);
    case UnaryOp::log: return log(x);
    case UnaryOp::sqrt: return sqrt(x);
    case UnaryOp::relu: return x > T(0) ? x : T(0);
    // Φ(z) as ½·erfc(−z/√2), not ½·(1 + erf(z/√2)): the latter cancels catastrophically for
    // negative z, where the Laplace weights of far clusters live.
    case UnaryOp::gelu: return x * normal_cdf(x);  // exact (erf-based) GELU
    case UnaryOp::sigmoid: return T(1) / (T(1) + exp(-x));
    default: return normal_cdf((x - T(kLaplaceMu)) / T(kLaplaceSigma));
  }
}

template <class T>
CAST_HD T unary_derivative(UnaryOp op, T x, T y) {
  switch (op) {
    case UnaryOp::exp: return y;
    case UnaryOp::log: return T(1) / x;
    case UnaryOp::sqrt: return T(0.5) / y;
    case UnaryOp::relu: return x > T(0) ? T(1) : T(0);
    case UnaryOp::gelu: return normal_cdf(x) + x * T(kInvSqrt2Pi) * exp(T(-0.5) * x * x);
    case UnaryOp::sigmoid: return y * (T(1) - y);
    default: {
      T z = (x - T(kLaplaceMu)) / T(kLaplaceSigma);
      return T(kInvSqrt2Pi) / T(kLaplaceSigma) * exp(T(-0.5) * z * z);
    }
  }
}

inline const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::sigmoid: return "sigmoid";
    default: return "laplace";
  }
}

}  // namespace cast
