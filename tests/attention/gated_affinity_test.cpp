// CAST step 3, the gate and the mixed affinities: the reference's and the fused op's finite
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

TEST(AttentionStepGrad, GatedAffinity) {
  Inputs in = {param({2, 5, 6}, 7), param({6, 3}, 8), param({3}, 9), param({2, 3, 5, 4}, 10, 0, 1),
               param({2, 3, 5, 4}, 11, 0, 1)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::gated_affinity(x[0], x[1], x[2], x[3], x[4]); }, in);
}

TEST(GatedAffinityFusedGrad, FiniteDifferences) {
  // B 2, N 5, D 4, G 3, C 3: the gradients of X, W_φ, b_φ, A_q and A_k
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::gated_affinity_fused(x[0], x[1], x[2], x[3], x[4]); },
                   (Inputs{param({2, 5, 4}, 63), param({4, 3}, 64), param({3}, 65), param({2, 3, 5, 3}, 66, 0.0, 1.0),
                           param({2, 3, 5, 3}, 67, 0.0, 1.0)}));
}
