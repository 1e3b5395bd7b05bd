#pragma once
// The CPU's elementwise functions in the forms its loops vectorise, shared by the unary ops
// (ops/unary.cpp) and the fused kernels that apply the same functions inside their own passes
// (ops/attention/cluster_affinities_fused.cpp): one definition, so a fused path computes exactly what the
// op it replaces computes.
#include <type_traits>

#include "math/fast_math.h"
#include "math/unary_math.h"

namespace cast::ops::unary_cpu {

// std::erfc and std::exp stay scalar library calls, and GELU's Φ took a sixth of a small
// model's training step. In f32 the CPU uses forms the compiler vectorises: erfc from a
// Chebyshev fit (relative error below 1.2e−7 for every u, Numerical Recipes' erfcc) and
// exp_nonpositive. f64 (the gradient checks) and CUDA keep math/unary_math.h.
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

}  // namespace cast::ops::unary_cpu
