// Improved clustered attention's output (ATTENTION.md §4): finite differences, the CPU kernel
// against the reference, the GPU's top-key kernel against the CPU.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <omp.h>
#include <set>
#include <tuple>

#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/full_attention_flash.h"
#include "ops/attention/head_projections.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"
#include "tensor/philox.h"
#include "tensor/precision.h"
#include "tests/attention/attention_test_util.h"
#include "tests/device_compare.h"
#include "tests/random_clusters.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

TEST(ImprovedClusteredFusedGrad, FiniteDifferences) {
  Tensor assign = Tensor::from_vector<int32_t>({0, 1, 0, 2, -1, 1, 1, 0, 2, 2}, {1, 2, 5});
  Tensor top = Tensor::from_vector<int32_t>({0, 3, 1, 2, 2, -1, 4, 0, 1, 3, 2, 0}, {1, 2, 3, 2});
  EXPECT_GRADCHECK(
      [&](const Inputs& x) {
        return ops::improved_clustered_output_fused(x[0], x[1], x[2], ops::softmax(x[3]), top, assign);
      },
      (Inputs{param({1, 2, 5, 4}, 44), param({1, 2, 5, 4}, 45), param({1, 2, 5, 4}, 46), param({1, 2, 3, 5}, 47)}));
}

TEST(ImprovedClusteredFused, MatchesReferenceOnRandomClusters) {
  for (auto [B, H, N, C, top, d] :
       std::vector<std::array<int64_t, 6>>{{1, 1, 6, 2, 3, 4}, {2, 3, 50, 7, 8, 8}, {1, 2, 257, 16, 32, 16}}) {
    const std::string what = fmt::format("B{} H{} N{} C{} top{} d{}", B, H, N, C, top, d);
    Tensor assign = random_assignment(B, H, N, C, 60 + N);
    Tensor keys = random_members(B, H, C, top, N, 61 + N);  // distinct keys per cluster, some slots empty
    for (DType dt : {DType::f32, DType::f64}) {
      auto make = [&](const Shape& s, uint64_t seed) {
        return Tensor::uniform(s, seed, 0, -2.0, 2.0, dt).set_requires_grad();
      };
      expect_same_op(
          [&](const Inputs& x, bool fused) {
            Tensor a_c = ops::softmax(x[3]);
            return fused ? ops::improved_clustered_output_fused(x[0], x[1], x[2], a_c, keys, assign)
                         : ops::improved_clustered_output(x[0], x[1], x[2], a_c, keys, assign);
          },
          Inputs{make({B, H, N, d}, 1), make({B, H, N, d}, 2), make({B, H, N, d}, 3), make({B, H, C, N}, 4)},
          dt == DType::f32 ? 2e-5 : 1e-11, dt == DType::f32 ? 2e-6 : 1e-13, what + " " + dtype_name(dt));
    }
  }
}

// The CPU kernel takes each top key out of A^c V once per slot: a key listed twice in one
// cluster (which ops::topk never gives) is refused instead of counted twice.
TEST(ImprovedClusteredFused, RefusesAKeyListedTwiceInACluster) {
  Tensor assign = Tensor::from_vector<int32_t>({0, 1, 0, 1}, {1, 1, 4});
  Tensor top = Tensor::from_vector<int32_t>({0, 2, 3, 3}, {1, 1, 2, 2});  // cluster 1 lists key 3 twice
  Tensor x = Tensor::uniform({1, 1, 4, 2}, 1, 0, -1.0, 1.0);
  EXPECT_CAST_ERROR(ops::improved_clustered_output_fused(x, x, x, Tensor::full({1, 1, 2, 4}, 0.25), top, assign),
                    "improved_clustered_output_fused: cluster 1 of head row 0 lists key 3 twice");
}

// Improved clustered attention on the GPU runs its top-key term fused (no per-query copies of
// K_T, V_T): values and every gradient against the CPU's step composition, with empty slots, a
// cluster with no key, keys shared by several clusters, unassigned (padded) queries, an empty
// cluster, and a head width that is not a multiple of anything.
TEST(CudaVsCpuAttention, ImprovedClusteredTopKeysFused) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, H = 2, N = 37, C = 5, top = 6, d = 12;
  std::vector<int32_t> assign(B * H * N), keys(B * H * C * top);
  uint64_t draw = 0;
  for (int64_t g = 0; g < B * H; ++g) {
    for (int64_t i = 0; i < N; ++i)  // cluster 4 stays empty; the last 5 queries of row 1 are padding
      assign[g * N + i] = g / H == 1 && i >= N - 5 ? -1 : static_cast<int32_t>(philox::uniform(3, draw++) * 4);
    for (int64_t j = 0; j < C; ++j)
      for (int64_t t = 0; t < top; ++t) {
        const double u = philox::uniform(4, draw++);
        keys[(g * C + j) * top + t] = j == 2 ? -1 : u < 0.2 ? -1 : static_cast<int32_t>(u * 10);  // keys 0..9: shared
      }
  }
  const Tensor assignment = Tensor::from_vector<int32_t>(assign, {B, H, N});
  const Tensor top_keys = Tensor::from_vector<int32_t>(keys, {B, H, C, top});
  expect_devices_agree(
      [&](const Inputs& x) {
        // the GPU's fast path against the CPU's step composition (keys listed twice in a cluster are
        // the reference's to take; the CPU's fused kernel refuses them)
        const ops::ImprovedClusteredOutputInputs in{
            x[0], x[1], x[2], ops::softmax(x[3]), on(top_keys, x[0]), on(assignment, x[0])};
        return x[0].is_cuda() ? ops::run_step(/*fast=*/true, in) : ops::run_reference(in);
      },
      Inputs{rand32({B, H, N, d}, 31), rand32({B, H, N, d}, 32), rand32({B, H, N, d}, 33), rand32({B, H, C, N}, 34)});
}
