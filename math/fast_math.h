#pragma once
// exp(x) for x ≤ 0, as the softmax of the fused attention ops needs it (scores minus their
// row maximum or log-sum-exp). f32: range reduction to r ∈ [−ln2/2, ln2/2] and a degree-6
// polynomial (the classic single-precision minimax coefficients, within 2 ulp of expf),
// written so the compiler vectorises it inside `omp simd` loops, where std::exp would stay
// a scalar call. f64 keeps std::exp: the finite-difference checks run in f64.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace cast::ops {

// The NaN rule, one for every softmax here (the reference ops and the fused kernels alike; the
// whole masked-row rule, on both devices, is math/softmax_rule.h):
// exp(NaN) is NaN, so a NaN score makes its row's sum, and so every probability of its row,
// NaN; a masked score (−∞) has probability 0 whatever the row's shift, as the reference's
// masking skips it. A clamp written `x < 0 ? x : 0` turns NaN into exp(0) = 1 and hides it:
// clamps here are written `x > 0 ? 0 : x`, which lets NaN through.
template <class T>
inline T at_most_zero(T x) {
  return x > T(0) ? T(0) : x;
}

inline float exp_nonpositive(float x_in) {
  // exp(−87) ≈ 1.6e−38: the smallest normal result. NaN is computed on as −87 (a NaN cast to
  // an integer below is undefined) and given back as NaN at the end.
  const float x = x_in >= -87.0f ? x_in : -87.0f;
  // n = round(x / ln 2) by the 1.5·2^23 trick: no floor call, which stays a library call
  // without -ffast-math and would stop the loop from vectorising
  constexpr float kRound = 12582912.0f;
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 split in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;                  // 2^n, n ∈ [−126, 0]
  const float result = x_in < -87.0f ? 0.0f : p * std::bit_cast<float>(exponent);  // 0 for −∞ (a masked score)
  return x_in == x_in ? result : x_in;                                             // NaN stays NaN
}

inline double exp_nonpositive(double x) { return std::exp(x); }

// max of s[0..n), −∞ for n = 0. Sixteen running maxima, so the compiler emits vector max
// instructions (a single running max is a serial chain it does not vectorise).
template <class T>
T max_of(const T* s, int64_t n) {
  constexpr int kLanes = 16;
  T lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = -std::numeric_limits<T>::infinity();
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] = s[c + l] > lanes[l] ? s[c + l] : lanes[l];
  for (; c < n; ++c) lanes[0] = s[c] > lanes[0] ? s[c] : lanes[0];
  T m = lanes[0];
  for (int l = 1; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

}  // namespace cast::ops
