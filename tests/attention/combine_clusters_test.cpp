// CAST step 7, each token's output from its clusters: finite differences with and without
// summaries, the fused CPU and GPU ops against the reference.
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

TEST(AttentionStepGrad, CombineWithAndWithoutSummaries) {
  Tensor members = sample_members();
  Inputs in = {param({1, 2, 5, 3}, 17, 0, 1), param({1, 2, 3, 2, 4}, 18), param({1, 2, 3, 4}, 19)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters(x[0], x[1], x[2], members); }, in);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters(x[0], x[1], Tensor(), members); },
                   (Inputs{in[0], in[1]}));
}

TEST(CombineFusedGrad, FiniteDifferences) {
  // B 1, H 2, N 6, C 3, κ 4, d 3: with the summaries (R_inter) and without
  Tensor members = random_members(1, 2, 3, 4, 6, 48);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters_fused(x[0], x[1], x[2], members); },
                   (Inputs{param({1, 2, 6, 3}, 51), param({1, 2, 3, 4, 3}, 52), param({1, 2, 3, 3}, 53)}));
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters_fused(x[0], x[1], Tensor(), members); },
                   (Inputs{param({1, 2, 6, 3}, 54), param({1, 2, 3, 4, 3}, 55)}));
}

// CAST's combine runs its sparse part fused on the GPU: values and the gradients of W, R_intra
// and R_inter against the CPU's composition, with tokens in several clusters, tokens in none,
// empty slots and an empty cluster, with summaries on and off.
TEST(CudaVsCpuAttention, CombineFused) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, H = 2, N = 29, C = 6, kappa = 7, d = 12;
  std::vector<int32_t> ids(B * H * C * kappa);
  uint64_t draw = 0;
  for (int64_t g = 0; g < B * H; ++g)
    for (int64_t c = 0; c < C; ++c) {  // distinct tokens per cluster, ascending; cluster 5 empty
      int64_t slot = 0;
      for (int64_t i = 0; i < N && slot < kappa; ++i)
        if (c != 5 && philox::uniform(8, draw++) < 0.3) ids[(g * C + c) * kappa + slot++] = static_cast<int32_t>(i);
      for (; slot < kappa; ++slot) ids[(g * C + c) * kappa + slot] = -1;
    }
  const Tensor members = Tensor::from_vector<int32_t>(ids, {B, H, C, kappa});
  const Inputs inputs{rand32({B, H, N, C}, 41, 0, 1), rand32({B, H, C, kappa, d}, 42), rand32({B, H, C, d}, 43)};
  auto combine = [&](const Inputs& x, const Tensor& r_inter) {
    return ops::run_step(/*fast=*/true, ops::CombineClustersInputs{x[0], x[1], r_inter, on(members, x[0])});
  };
  expect_devices_agree([&](const Inputs& x) { return combine(x, x[2]); }, inputs);
  expect_devices_agree([&](const Inputs& x) { return combine(x, Tensor()); }, Inputs{inputs[0], inputs[1]});
}
