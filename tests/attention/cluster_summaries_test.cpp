// CAST step 6, the clusters' summaries: finite differences, the fused CPU and GPU passes against
// the reference.
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

TEST(AttentionStepGrad, ClusterSummaries) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 0, 1, 1, 0, 0, 0}, {2, 5});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries(x[0], x[1], mask); },
                   (Inputs{param({2, 2, 5, 3}, 15, 0.1, 1), param({2, 2, 5, 4}, 16)}));
}

TEST(SummariesFusedGrad, FiniteDifferences) {
  // B 2, H 2, N 5, C 3, d 3; batch row 0 has a padded token. A_k positive, as a softmax gives.
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 5});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries_fused(ops::softmax(x[0]), x[1], mask); },
                   (Inputs{param({2, 2, 5, 3}, 56), param({2, 2, 5, 3}, 57)}));
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries_fused(ops::softmax(x[0]), x[1], Tensor()); },
                   (Inputs{param({2, 2, 5, 3}, 58), param({2, 2, 5, 3}, 59)}));
}

// CAST's summaries normalise each cluster's column in two fused passes on the GPU: values and
// the gradients of A_k and V against the CPU's composition, with N above one summation chunk
// (256 rows), padding, and a batch row with no real token (its columns sum to the 1e-30 floor).
TEST(CudaVsCpuAttention, SummariesFused) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 3, H = 2, N = 300, C = 5, d = 6;
  std::vector<float> m(B * N, 1.f);
  for (int64_t i = 200; i < N; ++i) m[i] = 0.f;        // row 0: padding at the end
  for (int64_t i = 0; i < N; ++i) m[2 * N + i] = 0.f;  // row 2: nothing real
  const Tensor mask = Tensor::from_vector<float>(m, {B, N});
  auto summaries = [](const Inputs& x, const Tensor& m) {
    return ops::run_step(/*fast=*/true, ops::ClusterSummariesInputs{x[0], x[1], m});
  };
  expect_devices_agree([&](const Inputs& x) { return summaries(x, on(mask, x[0])); },
                       Inputs{rand32({B, H, N, C}, 51, 0.05, 1), rand32({B, H, N, d}, 52)});
  expect_devices_agree([&](const Inputs& x) { return summaries(x, Tensor()); },
                       Inputs{rand32({B, H, N, C}, 53, 0.05, 1), rand32({B, H, N, d}, 54)});
}
