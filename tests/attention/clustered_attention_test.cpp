// Clustered attention's steps 3–5 (ATTENTION.md §3): finite differences, and the checks on supplied
// cluster ids.
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

TEST(AttentionStepGrad, ClusteredSteps) {
  Tensor assign = Tensor::from_vector<int32_t>({0, 1, 0, 2, -1, 1, 1, 0, 2, 2}, {1, 2, 5});
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 0}, {1, 5});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_centroids(x[0], assign, 3); },
                   Inputs{param({1, 2, 5, 4}, 20)});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::centroid_attention(x[0], x[1], mask); },
                   (Inputs{param({1, 2, 3, 4}, 21), param({1, 2, 5, 4}, 22)}));
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::broadcast_to_members(x[0], assign); },
                   Inputs{param({1, 2, 3, 4}, 23)});
  Tensor top = Tensor::from_vector<int32_t>({0, 3, 1, 2, 2, -1, 4, 0, 1, 3, 2, 0}, {1, 2, 3, 2});
  EXPECT_GRADCHECK(
      [&](const Inputs& x) {
        Tensor a_c = ops::softmax(x[3]);
        return ops::improved_clustered_output(x[0], x[1], x[2], a_c, top, assign);
      },
      (Inputs{param({1, 2, 5, 4}, 24), param({1, 2, 5, 4}, 25), param({1, 2, 5, 4}, 26), param({1, 2, 3, 5}, 27)}));
}

// A supplied assignment is input (cast layer reads it from a file): an id below -1, or one so
// large that it would size the centroid tensors, is refused with a message.
TEST(ClusteredAttention, SuppliedAssignmentIdsAreChecked) {
  nn::AttentionConfig c;
  c.mechanism = nn::Mechanism::clustered;
  c.dim = 8;
  c.heads = 2;
  nn::Attention layer(c, DType::f32);
  Tensor x = Tensor::normal({1, 5, 8}, 4, 0, 1.0, DType::f32, Device::cpu);
  auto ids = [](std::vector<int32_t> v) { return Tensor::from_vector<int32_t>(v, {1, 2, 5}, Device::cpu); };
  EXPECT_CAST_ERROR(layer.forward(x, Tensor(), ids({0, 1, 2, 3, 4, 0, 1, 2, 3, 2147483647})),
                    "assignment names cluster 2147483647 but 5 tokens fill at most 5 clusters");
  EXPECT_CAST_ERROR(layer.forward(x, Tensor(), ids({0, 1, 2, 3, 4, 0, 1, -7, 3, 2})), "assignment holds -7");
  EXPECT_EQ(layer.forward(x, Tensor(), ids({0, 1, 2, 3, 4, 0, 1, -1, 3, 2})).out.shape(), (Shape{1, 5, 8}));
}
