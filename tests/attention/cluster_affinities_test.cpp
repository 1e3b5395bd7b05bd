// CAST steps 1–2, the affinities to the surrogates: the reference's and the fused op's finite
// differences.
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

TEST(AttentionStepGrad, SurrogateScoresAndProbabilities) {
  Inputs in = {param({2, 3, 5, 4}, 4), param({3, 6, 4}, 5)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::surrogate_scores(x[0], x[1], 0.5); }, in);
  for (auto f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
    EXPECT_GRADCHECK([f](const Inputs& x) { return ops::cluster_probabilities(x[0], f); },
                     Inputs{param({2, 3, 5}, 6, -1.0, 2.0)});
}

TEST(ClusterAffinitiesFusedGrad, FiniteDifferences) {
  // B 2, G 2, N 5, C 3, w 4: the softmax rows and the Laplace rows, gradients of X and S
  for (ops::AttentionFn f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
    EXPECT_GRADCHECK([f](const Inputs& x) { return ops::cluster_affinities_fused(x[0], x[1], f); },
                     (Inputs{param({2, 2, 5, 4}, 61), param({2, 3, 4}, 62)}));
}
