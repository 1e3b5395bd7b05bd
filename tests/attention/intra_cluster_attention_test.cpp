// CAST step 5, attention inside each cluster: finite differences, the CPU tile kernel against the
// reference, the GPU's flash-based kernel against the CPU.
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

TEST(AttentionStepGrad, IntraClusterAttention) {
  Tensor members = sample_members();
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::intra_cluster_attention(x[0], x[1], x[2], members); },
                   (Inputs{param({1, 2, 5, 3}, 12), param({1, 2, 5, 3}, 13), param({1, 2, 5, 3}, 14)}));
}

TEST(IntraClusterFusedGrad, FiniteDifferences) {
  Tensor members = random_members(1, 2, 3, 4, 6, 40);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::intra_cluster_attention_fused(x[0], x[1], x[2], members); },
                   (Inputs{param({1, 2, 6, 3}, 41), param({1, 2, 6, 3}, 42), param({1, 2, 6, 3}, 43)}));
}

TEST(IntraClusterFused, MatchesReferenceOnRandomClusters) {
  for (auto [B, H, N, C, kappa, d] : std::vector<std::array<int64_t, 6>>{
           {1, 1, 5, 2, 3, 4}, {2, 3, 40, 6, 9, 8}, {1, 2, 300, 17, 24, 16}, {2, 1, 64, 8, 64, 32}}) {
    const std::string what = fmt::format("B{} H{} N{} C{} kappa{} d{}", B, H, N, C, kappa, d);
    Tensor members = random_members(B, H, C, kappa, N, 50 + N);
    for (DType dt : {DType::f32, DType::f64}) {
      auto make = [&](uint64_t seed) {
        return Tensor::uniform({B, H, N, d}, seed, 0, -2.0, 2.0, dt).set_requires_grad();
      };
      expect_same_op(
          [&](const Inputs& x, bool fused) {
            return fused ? ops::intra_cluster_attention_fused(x[0], x[1], x[2], members)
                         : ops::intra_cluster_attention(x[0], x[1], x[2], members);
          },
          Inputs{make(1), make(2), make(3)}, dt == DType::f32 ? 2e-5 : 1e-11, dt == DType::f32 ? 2e-6 : 1e-13,
          what + " " + dtype_name(dt));
    }
  }
}

// CAST's fused intra-cluster attention on the device (gathered rows, flash attention with the
// filled slots as the key mask) against the CPU's fused kernel: clusters of κ 5 and 37 (a
// partial tile of 32), empty slots, a cluster with no member, tokens in several clusters.
TEST(CudaVsCpuAttention, IntraClusterAttentionFused) {
  SKIP_WITHOUT_GPU();
  for (int64_t kappa : {5, 37}) {
    const int64_t B = 2, H = 2, N = 41, C = 3, d = 8;
    std::vector<int32_t> ids(B * H * C * kappa);
    uint64_t draw = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const double u = philox::uniform(99 + kappa, draw++);
      ids[i] = u < 0.2 ? -1 : static_cast<int32_t>(u * N) % N;  // repeats across clusters, some empty slots
    }
    for (int64_t s = 0; s < kappa; ++s) ids[1 * kappa + s] = -1;  // head 0's cluster 1: no member
    const Tensor members = Tensor::from_vector<int32_t>(ids, {B, H, C, kappa});
    expect_devices_agree(
        [&](const Inputs& x) {  // the CPU's tile kernel against the GPU's flash-based one
          return ops::run_step(/*fast=*/true, ops::IntraClusterAttentionInputs{x[0], x[1], x[2], on(members, x[0])});
        },
        Inputs{rand32({B, H, N, d}, 80 + kappa), rand32({B, H, N, d}, 81 + kappa), rand32({B, H, N, d}, 82 + kappa)});
  }
}
