#pragma once
// Random cluster ids for the tests of the clustering steps (tests/attention/,
// tests/attention/fast_paths_test.cpp).
#include <algorithm>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace cast::testing {

// (B, H, C, κ) random members: tokens in [0, N), a token may sit in several clusters, about
// one slot in five empty (−1); ids distinct within a cluster.
inline Tensor random_members(int64_t B, int64_t H, int64_t C, int64_t kappa, int64_t N, uint64_t seed) {
  auto u = Tensor::uniform({B * H * C, N + 1}, seed, 0, 0.0, 1.0, DType::f64).to_double_vector();
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < B * H * C; ++r) {
    std::vector<std::pair<double, int32_t>> order;
    for (int64_t i = 0; i < N; ++i) order.push_back({u[r * (N + 1) + i], static_cast<int32_t>(i)});
    std::sort(order.begin(), order.end());
    for (int64_t s = 0; s < kappa; ++s) {
      const bool empty = s >= N || u[r * (N + 1) + N] * 5 > 4 - 0.2 * static_cast<double>(s % 3);
      ids.push_back(empty ? -1 : order[s].second);
    }
  }
  return Tensor::from_vector<int32_t>(ids, {B, H, C, kappa});
}

inline Tensor random_assignment(int64_t B, int64_t H, int64_t N, int64_t C, uint64_t seed) {
  auto u = Tensor::uniform({B * H * N}, seed, 0, 0.0, 1.0, DType::f64).to_double_vector();
  std::vector<int32_t> a;
  for (double x : u) a.push_back(x < 0.1 ? -1 : static_cast<int32_t>(x * 1000) % static_cast<int32_t>(C));
  return Tensor::from_vector<int32_t>(a, {B, H, N});
}

}  // namespace cast::testing
