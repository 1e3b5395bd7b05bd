#pragma once
// Helpers shared by the test suites.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "ops/ops.h"
#include "tensor/device_memory.h"

namespace cast::testing {

// A random f64 CPU tensor in [lo, hi) that requires grad.
inline Tensor param(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::uniform(shape, seed, 0, lo, hi, DType::f64);
  t.set_requires_grad();
  return t;
}

inline Tensor constant(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, DType dtype = DType::f64) {
  return Tensor::uniform(shape, seed, 0, lo, hi, dtype);
}

// Asserts that the f64 finite-difference check passes at relative error 1e-6.
#define EXPECT_GRADCHECK(fn, inputs)                            \
  do {                                                          \
    auto cast_gc = ::cast::autograd::gradcheck((fn), (inputs)); \
    EXPECT_TRUE(cast_gc.ok) << cast_gc.report;                  \
    EXPECT_LE(cast_gc.max_error, 1e-6) << cast_gc.report;       \
  } while (0)

// A file's whole contents ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_double_vector()) m = std::max(m, std::abs(v));
  return m;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  auto va = a.to_double_vector(), vb = b.to_double_vector();
  EXPECT_EQ(va.size(), vb.size());
  double m = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// ‖a − b‖ / ‖b‖ over b's finite elements; equal elements agree, equal infinities too (a row's
// log-sum-exp −∞ where it has no real key). NaN anywhere gives NaN, so a poisoned value never
// passes.
inline double rel_diff(const Tensor& a, const Tensor& b) {
  auto va = a.to_double_vector(), vb = b.to_double_vector();
  if (va.size() != vb.size()) return 1e30;
  double d = 0, n = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (va[i] != vb[i]) d += (va[i] - vb[i]) * (va[i] - vb[i]);
    if (std::isfinite(vb[i])) n += vb[i] * vb[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

// a − b as an f64 CPU tensor of a's shape: what a backward added to a gradient that held b.
inline Tensor difference(const Tensor& a, const Tensor& b) {
  std::vector<double> va = a.to_double_vector();
  const std::vector<double> vb = b.to_double_vector();
  EXPECT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) va[i] -= vb[i];
  return Tensor::from_vector<double>(va, a.shape());
}

// Every element of `got` within atol + rtol·|want|, and ‖got − want‖/‖want‖ ≤ rtol
// (ATTENTION.md: 1e-5 in fp32): one wrong element cannot hide in a large tensor.
inline void expect_close_per_element(const Tensor& got, const Tensor& want, double rtol, double atol,
                                     const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  auto g = got.to_double_vector(), c = want.to_double_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < c.size(); ++i)
    if (!(std::abs(g[i] - c[i]) <= atol + rtol * std::abs(c[i])) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", the reference " << c[i];
  EXPECT_EQ(bad, 0) << what << ": elements that differ";
  if (!c.empty()) EXPECT_LE(rel_diff(got, want), rtol) << what;
}

inline void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-6) {
  auto v = t.to_double_vector();
  ASSERT_EQ(v.size(), expected.size()) << t.describe();
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

// Skips the calling test when no GPU is usable.
#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    if (!::cast::device_memory::cuda_built()) GTEST_SKIP() << "built without CUDA";       \
    if (!::cast::device_memory::cuda_available())                                         \
      GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount found none or no driver)"; \
  } while (0)

// Expects `stmt` to throw cast::Error whose message contains `needle`.
#define EXPECT_CAST_ERROR(stmt, needle)                                             \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "expected an error containing '" << (needle) << "'";         \
    } catch (const ::cast::Error& e) {                                              \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

// A (B, N) mask with `padding[b]` padded positions at the end of row b.
inline Tensor tail_mask(int64_t N, const std::vector<int64_t>& padding, DType dtype) {
  std::vector<double> m;
  for (int64_t pad : padding)
    for (int64_t i = 0; i < N; ++i) m.push_back(i < N - pad ? 1.0 : 0.0);
  return Tensor::from_vector<double>(m, {static_cast<int64_t>(padding.size()), N}).to(dtype);
}

}  // namespace cast::testing
