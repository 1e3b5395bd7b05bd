// Fused CPU attention kernels against the step-by-step reference ops: f64 finite differences,
// and values plus every gradient on random shapes with padding (every new tensor starts
// poisoned, so an unwritten element fails). Tiles are 64 queries × 128 keys, so the shapes
// below cover partial tiles, several tiles, and key splits (fewer heads than threads).
#include <omp.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>

#include "nn/attention.h"
#include "ops/attention.h"
#include "ops/fast.h"
#include "ops/flash_attention.h"
#include "ops/head_projections.h"
#include "ops/ops.h"
#include "tests/random_clusters.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

namespace {

struct Shape5 {
  int64_t B, H, M, N, d;
};

std::string label(const Shape5& s) { return fmt::format("B{} H{} M{} N{} d{}", s.B, s.H, s.M, s.N, s.d); }

}  // namespace

// ---------------------------------------------------------------- finite differences (f64)
TEST(FlashAttentionGrad, SmallWithPadding) {
  Tensor mask = tail_mask(5, {0, 2}, DType::f64);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], mask); },
                   (Inputs{param({2, 2, 4, 3}, 1), param({2, 2, 5, 3}, 2), param({2, 2, 5, 3}, 3)}));
}

TEST(FlashAttentionGrad, SeveralTilesAndAFullyPaddedRow) {
  // 70 queries (two query tiles), 140 keys (two key tiles); batch 1 is all padding.
  Tensor mask = tail_mask(140, {3, 140}, DType::f64);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], mask); },
                   (Inputs{param({2, 1, 70, 2}, 4), param({2, 1, 140, 2}, 5), param({2, 1, 140, 2}, 6)}));
}

// ---------------------------------------------------------------- against the reference
class FlashAgainstReference : public ::testing::TestWithParam<Shape5> {};

TEST_P(FlashAgainstReference, ValuesAndEveryGradient) {
  const Shape5 s = GetParam();
  for (DType dtype : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double rtol = dtype == DType::f32 ? 2e-5 : 1e-11, atol = dtype == DType::f32 ? 2e-6 : 1e-13;
    std::vector<int64_t> padding;
    for (int64_t b = 0; b < s.B; ++b) padding.push_back((b * 37) % std::max<int64_t>(s.N / 2, 1));
    Tensor mask = tail_mask(s.N, padding, dtype);
    auto make = [&](int64_t rows, uint64_t seed) {
      return Tensor::uniform({s.B, s.H, rows, s.d}, seed, 0, -2.0, 2.0, dtype).set_requires_grad();
    };
    Tensor q = make(s.M, 11), k = make(s.N, 12), v = make(s.N, 13);
    Tensor dout = Tensor::uniform({s.B, s.H, s.M, s.d}, 14, 0, -1.0, 1.0, dtype);
    std::vector<Tensor> grads[2];
    Tensor outs[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor out = fused ? ops::flash_attention(q, k, v, mask) : ops::full_attention(q, k, v, mask);
      autograd::backward(out, dout);
      outs[fused] = out;
      grads[fused] = {q.grad(), k.grad(), v.grad()};
      for (Tensor* t : {&q, &k, &v}) t->reset_grad();
    }
    expect_close_per_element(outs[1], outs[0], rtol, atol, "output " + label(s));
    const char* names[] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; ++i)
      expect_close_per_element(grads[1][i], grads[0][i], rtol, atol, names[i] + (" " + label(s)));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAgainstReference,
                         ::testing::Values(Shape5{1, 1, 1, 1, 1}, Shape5{2, 3, 17, 29, 8}, Shape5{1, 1, 64, 128, 16},
                                           Shape5{2, 2, 130, 300, 32}, Shape5{1, 1, 200, 257, 64},
                                           Shape5{3, 1, 9, 400, 5},
                                           // the forward's 256-query tiles: a second one and a partial last
                                           Shape5{2, 2, 600, 300, 32}),
                         [](const ::testing::TestParamInfo<Shape5>& info) {
                           const Shape5& s = info.param;
                           return fmt::format("B{}_H{}_M{}_N{}_d{}", s.B, s.H, s.M, s.N, s.d);
                         });

// The key splits (fewer heads than threads) sum dQ over partial buffers: run with 3 threads
// even where ctest gives each test one.
TEST(FlashAttention, KeySplitsAgreeWithOneThread) {
  Tensor q = Tensor::uniform({1, 1, 90, 8}, 21, 0, -2.0, 2.0, DType::f64).set_requires_grad();
  Tensor k = Tensor::uniform({1, 1, 500, 8}, 22, 0, -2.0, 2.0, DType::f64).set_requires_grad();
  Tensor v = Tensor::uniform({1, 1, 500, 8}, 23, 0, -2.0, 2.0, DType::f64).set_requires_grad();
  Tensor dout = Tensor::uniform({1, 1, 90, 8}, 24, 0, -1.0, 1.0, DType::f64);
  const int saved = omp_get_max_threads();
  std::vector<double> results[2];
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : 3);
    Tensor out = ops::flash_attention(q, k, v, Tensor());
    autograd::backward(out, dout);
    for (Tensor* t : {&q, &k, &v}) {
      auto g = t->grad().to_double_vector();
      results[run].insert(results[run].end(), g.begin(), g.end());
      t->reset_grad();
    }
  }
  omp_set_num_threads(saved);
  ASSERT_EQ(results[0].size(), results[1].size());
  double worst = 0;
  for (size_t i = 0; i < results[0].size(); ++i) worst = std::max(worst, std::abs(results[0][i] - results[1][i]));
  EXPECT_LE(worst, 1e-12);
}

TEST(FlashAttention, RejectsMismatchedShapes) {
  Tensor q = Tensor::zeros({1, 2, 4, 3}), k = Tensor::zeros({1, 2, 5, 4});
  EXPECT_CAST_ERROR(ops::flash_attention(q, k, k, Tensor()), "share batch, heads and width");
  Tensor k2 = Tensor::zeros({1, 2, 5, 3});
  EXPECT_CAST_ERROR(ops::flash_attention(q, k2, k2, Tensor::zeros({1, 4})), "mask");
}

// ---------------------------------------------------------------- whole layers: fused vs reference
struct LayerCase {
  const char* name;
  nn::Mechanism mechanism;
  bool single_assignment;
};

class FusedLayer : public ::testing::TestWithParam<LayerCase> {};

// On a long sequence with one row padded, and on a short one where a cluster of κ 6 outnumbers
// the 5 tokens. There every Top-K cluster holds every real token, so each R_intra row is full
// attention's and the output, Σ_c W[i,c] R_intra[c][i] with Σ_c W[i,c] = 1, is full attention:
// the gate and the surrogates get no gradient, on either path, but for rounding.
TEST_P(FusedLayer, MatchesReferenceLayer) {
  const LayerCase lc = GetParam();
  struct Size {
    int64_t N, clusters, cluster_size, padded;
  };
  for (const Size size : {Size{150, 16, 16, 41}, Size{5, 3, 6, 2}}) {
    const int64_t B = 2, N = size.N, D = 32;
    const std::string what = fmt::format("{} N {} C {} kappa {}", lc.name, N, size.clusters, size.cluster_size);
    nn::AttentionConfig c;
    c.mechanism = lc.mechanism;
    c.dim = D;
    c.heads = 4;
    c.clusters = size.clusters;
    c.cluster_size = size.cluster_size;
    c.single_assignment = lc.single_assignment;
    c.topk = 8;
    c.bits = 16;
    c.seed = 5;
    Tensor mask = tail_mask(N, {0, size.padded}, DType::f32);
    Tensor x = Tensor::uniform({B, N, D}, 31, 0, -1.0, 1.0, DType::f32).set_requires_grad();
    Tensor dout = Tensor::uniform({B, N, D}, 32, 0, -1.0, 1.0, DType::f32);
    std::map<std::string, Tensor> grads[2];
    Tensor outs[2];
    for (int fused = 0; fused < 2; ++fused) {
      c.fused = fused == 1;
      nn::Attention layer(c, DType::f32);
      outs[fused] = layer.forward(x, mask).out;
      autograd::backward(outs[fused], dout);
      grads[fused]["x"] = x.grad();
      x.reset_grad();
      for (auto& [name, p] : layer.parameters()) grads[fused][name] = p.grad();
    }
    expect_close_per_element(outs[1], outs[0], 3e-5, 3e-6, what + " output");
    ASSERT_EQ(grads[0].size(), grads[1].size());
    const bool every_token_everywhere = lc.mechanism == nn::Mechanism::cast && !lc.single_assignment &&
                                        size.cluster_size >= N && c.f == ops::AttentionFn::softmax;
    const double scale = max_abs(grads[0]["wv"]);
    for (auto& [name, g] : grads[0]) {
      if (every_token_everywhere && (name == "gate_w" || name == "gate_b" || name == "surrogates")) {
        EXPECT_LT(max_abs(g), 1e-6 * scale) << what << " d" << name << " of the reference";
        EXPECT_LT(max_abs(grads[1][name]), 1e-6 * scale) << what << " d" << name << " of the fast path";
        continue;
      }
      expect_close_per_element(grads[1][name], g, 3e-5, 3e-6, what + " d" + name);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, FusedLayer,
                         ::testing::Values(LayerCase{"full", nn::Mechanism::full, false},
                                           LayerCase{"cast_topk", nn::Mechanism::cast, false},
                                           LayerCase{"cast_satopk", nn::Mechanism::cast, true},
                                           LayerCase{"clustered", nn::Mechanism::clustered, false},
                                           LayerCase{"iclustered", nn::Mechanism::iclustered, false}),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name; });

// ---------------------------------------------------------------- fused clustering steps
namespace {

// Values and every gradient of fn(fused) against fn(reference) on the same inputs.
void expect_same_op(const std::function<Tensor(const Inputs&, bool)>& fn, Inputs inputs, double rtol, double atol,
                    const std::string& what) {
  Tensor outs[2];
  std::vector<Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    outs[fused] = fn(inputs, fused == 1);
    Tensor dout = Tensor::uniform(outs[fused].shape(), 77, 0, -1.0, 1.0, outs[fused].dtype());
    autograd::backward(outs[fused], dout);
    for (Tensor& t : inputs) {
      grads[fused].push_back(t.grad());
      t.reset_grad();
    }
  }
  expect_close_per_element(outs[1], outs[0], rtol, atol, what + " output");
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_close_per_element(grads[1][i], grads[0][i], rtol, atol, what + fmt::format(" gradient of input {}", i));
}

}  // namespace

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

TEST(CombineFusedGrad, FiniteDifferences) {
  // B 1, H 2, N 6, C 3, κ 4, d 3: with the summaries (R_inter) and without
  Tensor members = random_members(1, 2, 3, 4, 6, 48);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters_fused(x[0], x[1], x[2], members); },
                   (Inputs{param({1, 2, 6, 3}, 51), param({1, 2, 3, 4, 3}, 52), param({1, 2, 3, 3}, 53)}));
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters_fused(x[0], x[1], Tensor(), members); },
                   (Inputs{param({1, 2, 6, 3}, 54), param({1, 2, 3, 4, 3}, 55)}));
}

TEST(SummariesFusedGrad, FiniteDifferences) {
  // B 2, H 2, N 5, C 3, d 3; batch row 0 has a padded token. A_k positive, as a softmax gives.
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 5});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries_fused(ops::softmax(x[0]), x[1], mask); },
                   (Inputs{param({2, 2, 5, 3}, 56), param({2, 2, 5, 3}, 57)}));
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries_fused(ops::softmax(x[0]), x[1], Tensor()); },
                   (Inputs{param({2, 2, 5, 3}, 58), param({2, 2, 5, 3}, 59)}));
}

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

TEST(ClusterAffinitiesFusedGrad, FiniteDifferences) {
  // B 2, G 2, N 5, C 3, w 4: the softmax rows and the Laplace rows, gradients of X and S
  for (ops::AttentionFn f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
    EXPECT_GRADCHECK([f](const Inputs& x) { return ops::cluster_affinities_fused(x[0], x[1], f); },
                     (Inputs{param({2, 2, 5, 4}, 61), param({2, 3, 4}, 62)}));
}

TEST(GatedAffinityFusedGrad, FiniteDifferences) {
  // B 2, N 5, D 4, G 3, C 3: the gradients of X, W_φ, b_φ, A_q and A_k
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::gated_affinity_fused(x[0], x[1], x[2], x[3], x[4]); },
                   (Inputs{param({2, 5, 4}, 63), param({4, 3}, 64), param({3}, 65), param({2, 3, 5, 3}, 66, 0.0, 1.0),
                           param({2, 3, 5, 3}, 67, 0.0, 1.0)}));
}

TEST(HeadProjectionsGrad, FiniteDifferences) {
  // B 2, N 3, D 4, 2 heads of width 3 (w (4, 6)), and the output projection back to 5
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::project_heads(x[0], x[1], 2); },
                   (Inputs{param({2, 3, 4}, 71), param({4, 6}, 72)}));
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::merge_heads_project(x[0], x[1]); },
                   (Inputs{param({2, 2, 3, 3}, 73), param({6, 5}, 74)}));
}

// The in-place head projections against the reference's product and permute, values and the
// gradient of every input: once from no gradient (the first gradient is written, not added) and
// once from random gradients (a backward that overwrites instead of adding fails).
TEST(HeadProjections, MatchTheProductAndPermute) {
  using Fn = std::function<Tensor(const Inputs&, bool)>;
  auto compare = [](const Fn& fn, const std::vector<Shape>& shapes, DType dt, const std::string& what) {
    const double rtol = dt == DType::f32 ? 1e-5 : 1e-12, atol = dt == DType::f32 ? 1e-6 : 1e-13;
    for (bool prefilled : {false, true}) {
      Tensor outs[2];
      std::vector<Tensor> grads[2];
      for (int fused = 0; fused < 2; ++fused) {
        Inputs in;
        for (size_t i = 0; i < shapes.size(); ++i) {
          in.push_back(Tensor::uniform(shapes[i], 10 + i, 0, -1.0, 1.0, dt).set_requires_grad());
          if (prefilled) in.back().set_grad(Tensor::uniform(shapes[i], 20 + i, 0, -1.0, 1.0, dt));
        }
        outs[fused] = fn(in, fused == 1);
        autograd::backward(outs[fused], Tensor::uniform(outs[fused].shape(), 77, 0, -1.0, 1.0, dt));
        for (Tensor& t : in) grads[fused].push_back(t.grad());
      }
      const std::string how = what + (prefilled ? ", gradients prefilled" : ", no gradients before");
      expect_close_per_element(outs[1], outs[0], rtol, atol, how + " output");
      for (size_t i = 0; i < shapes.size(); ++i)
        expect_close_per_element(grads[1][i], grads[0][i], rtol, atol, how + fmt::format(" gradient of input {}", i));
    }
  };
  // The last shape's gradient (300 rows of width 1024) is laid out token-major in chunks of 256
  // rows on the CPU, the second chunk starting inside the second batch row. It runs in f64 only:
  // in f32 its sums of 1024 products differ from the reference's order by more than the
  // tolerance of these small shapes.
  for (auto [B, N, D, H, d] :
       std::vector<std::array<int64_t, 5>>{{1, 1, 1, 1, 1}, {2, 7, 12, 3, 4}, {3, 33, 16, 2, 9}, {2, 150, 3, 4, 256}})
    for (DType dt : {DType::f32, DType::f64}) {
      if (H * d > 1000 && dt == DType::f32) continue;
      const std::string what = fmt::format("B{} N{} D{} H{} d{} {}", B, N, D, H, d, dtype_name(dt));
      compare(
          [&](const Inputs& x, bool fused) {
            if (fused) return ops::project_heads(x[0], x[1], H);
            return ops::permute(ops::reshape(ops::matmul(x[0], x[1]), {B, N, H, d}), {0, 2, 1, 3});
          },
          {{B, N, D}, {D, H * d}}, dt, what + " project_heads");
      compare(
          [&](const Inputs& x, bool fused) {
            if (fused) return ops::merge_heads_project(x[0], x[1]);
            return ops::matmul(ops::reshape(ops::permute(x[0], {0, 2, 1, 3}), {B, N, H * d}), x[1]);
          },
          {{B, H, N, d}, {H * d, D}}, dt, what + " merge_heads_project");
    }
}

// No tokens: the weight's first gradient is a sum of no products, zeros, not what the buffer held.
TEST(HeadProjections, NoTokensGiveAZeroWeightGradient) {
  Tensor x = Tensor::zeros({2, 0, 3}).set_requires_grad();
  Tensor w = Tensor::uniform({3, 4}, 5, 0, -1.0, 1.0, DType::f32).set_requires_grad();
  Tensor out = ops::project_heads(x, w, 2);
  ASSERT_EQ(out.shape(), (Shape{2, 2, 0, 2}));
  autograd::backward(out, Tensor::zeros(out.shape()));
  for (double v : w.grad().to_double_vector()) EXPECT_EQ(v, 0.0);
}

// ---------------------------------------------------------------- CAST steps 1–3 and 5–7 in one op
namespace {

ops::StepOptions cast_options(int variant) {  // every combination of f, summaries and mixing weights
  return {variant & 1 ? ops::AttentionFn::laplace : ops::AttentionFn::softmax, (variant & 2) == 0, (variant & 4) != 0};
}

std::string describe(const ops::StepOptions& o) {
  return fmt::format("{} summaries {} mix {}", o.f == ops::AttentionFn::softmax ? "softmax" : "laplace",
                     o.summaries ? "on" : "off", o.mix_query ? "query" : "affinity");
}

}  // namespace

TEST(CastAttentionFusedGrad, FiniteDifferences) {
  // B 2, H 2, N 5 (batch row 1 with a padded token), d 3, D 4, C 3, κ 3: the gradients of x,
  // W_φ, b_φ, q, k, v and S, in each of the eight settings
  const Tensor members = random_members(2, 2, 3, 3, 5, 70);
  const Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, {2, 5});
  for (int variant = 0; variant < 8; ++variant) {
    const ops::StepOptions o = cast_options(variant);
    SCOPED_TRACE(describe(o));
    EXPECT_GRADCHECK(
        [&](const Inputs& x) {
          return ops::cast_attention_fused(ops::cast_gate(x[0], x[1], x[2]), x[3], x[4], x[5], x[6], mask, members, o);
        },
        (Inputs{param({2, 5, 4}, 71), param({4, 2}, 72), param({2}, 73), param({2, 2, 5, 3}, 74),
                param({2, 2, 5, 3}, 75), param({2, 2, 5, 3}, 76), param({2, 3, 3}, 77)}));
  }
}

// The one op against the chain of step ops, in every setting, on shapes of several row tiles,
// more groups than threads and fewer, clusters that overlap and slots left empty.
TEST(CastAttentionFused, MatchesTheStepChainInEverySetting) {
  for (auto [B, H, N, C, kappa, d, D] : std::vector<std::array<int64_t, 7>>{
           {1, 1, 7, 2, 4, 3, 5}, {2, 3, 130, 12, 16, 8, 24}, {1, 2, 300, 17, 24, 16, 32}}) {
    const Tensor members = random_members(B, H, C, kappa, N, 80 + N);
    for (DType dt : {DType::f32, DType::f64}) {
      const Tensor mask = tail_mask(N, std::vector<int64_t>(B, N / 3), dt);
      auto make = [&](const Shape& s, uint64_t seed) {
        return Tensor::uniform(s, seed, 0, -2.0, 2.0, dt).set_requires_grad();
      };
      for (int variant = 0; variant < 8; ++variant) {
        const ops::StepOptions o = cast_options(variant);
        const std::string what =
            fmt::format("B{} H{} N{} C{} kappa{} d{} D{} {} {}", B, H, N, C, kappa, d, D, describe(o), dtype_name(dt));
        Inputs x{make({B, N, D}, 1),    make({D, H}, 2),       make({H}, 3),      make({B, H, N, d}, 4),
                 make({B, H, N, d}, 5), make({B, H, N, d}, 6), make({H, C, d}, 7)};
        const Tensor dout = Tensor::uniform({B, H, N, d}, 77, 0, -1.0, 1.0, dt);
        Tensor outs[2];
        std::vector<Tensor> grads[2];
        for (int fused = 0; fused < 2; ++fused) {
          const Tensor g = ops::cast_gate(x[0], x[1], x[2]);
          outs[fused] =
              fused ? ops::cast_attention_fused(g, x[3], x[4], x[5], x[6], mask, members, o)
                    : ops::run_reference(ops::Step::cast_attention, {g, x[3], x[4], x[5], x[6], mask, members}, o);
          autograd::backward(outs[fused], dout);
          for (Tensor& t : x) {
            grads[fused].push_back(t.grad());
            t.reset_grad();
          }
        }
        // Once more with nothing but the op holding its output when its backward runs, as in the
        // layer: backward() releases the output's values first (the op reads none of them).
        std::vector<Tensor> released_grads;
        {
          Tensor loss;
          std::weak_ptr<TensorImpl> op_output;
          {
            const Tensor out =
                ops::cast_attention_fused(ops::cast_gate(x[0], x[1], x[2]), x[3], x[4], x[5], x[6], mask, members, o);
            op_output = out.impl_ptr();
            loss = ops::sum_all(ops::mul(out, dout));
          }
          ASSERT_EQ(op_output.use_count(), 2) << what << ": the op's node and mul's, which runs and goes first";
          autograd::backward(loss);
          EXPECT_TRUE(op_output.expired()) << what;
          for (Tensor& t : x) {
            released_grads.push_back(t.grad());
            t.reset_grad();
          }
        }
        const double rtol = dt == DType::f32 ? 3e-5 : 1e-10, atol = dt == DType::f32 ? 3e-6 : 1e-12;
        expect_close_per_element(outs[1], outs[0], rtol, atol, what + " output");
        for (size_t i = 0; i < x.size(); ++i) {
          // with W = A_q the gate gets no gradient from either
          ASSERT_EQ(grads[1][i].defined(), grads[0][i].defined()) << what << " gradient of input " << i;
          ASSERT_EQ(released_grads[i].defined(), grads[0][i].defined()) << what << " gradient of input " << i;
          if (!grads[0][i].defined()) continue;
          expect_close_per_element(grads[1][i], grads[0][i], rtol, atol,
                                   what + fmt::format(" gradient of input {}", i));
          expect_close_per_element(released_grads[i], grads[0][i], rtol, atol,
                                   what + fmt::format(" gradient of input {}, output released", i));
        }
      }
    }
  }
}

// The layer runs the one op where it fits and keeps no (B, H, N, C) tensor for the backward:
// the tape of a CAST layer with fast paths on saves none of A_q, A_k, A_g, P or R_intra.
TEST(CastAttentionFused, TheLayerRunsItAndItsTapeKeepsNoAffinities) {
  nn::AttentionConfig c;
  c.mechanism = nn::Mechanism::cast;
  c.dim = 16, c.heads = 2, c.clusters = 4, c.cluster_size = 8, c.seed = 3;
  EXPECT_EQ(nn::fast_path_steps(c).back(), ops::Step::cast_attention);
  nn::Attention layer(c, DType::f32);
  Tensor x = Tensor::uniform({2, 30, 16}, 4, 0, -1.0, 1.0, DType::f32).set_requires_grad();
  Tensor out = layer.forward(x, Tensor()).out;
  struct SavedBytes final : autograd::FieldVisitor {
    size_t bytes = 0;
    void input(const char*, const Tensor&) override {}
    void saved(const char*, const Tensor& t) override { bytes += t.defined() ? t.nbytes() : 0; }
  };
  size_t saved_bytes = 0;
  bool ran = false;
  autograd::for_each_node([&](const autograd::Node& node) {
    if (std::string(node.name()) != "cast_attention_fused") return;
    ran = true;
    SavedBytes count;
    node.fields(count);
    saved_bytes = count.bytes;
  });
  autograd::clear_tape();
  EXPECT_TRUE(ran);
  // R_inter (2, 2, 4, 8), the column sums (2, 2, 4), the slots' log-sum-exp and mixing weights
  // (2, 2, 4, 8) each, 4 bytes each (the gate g is an input)
  EXPECT_EQ(saved_bytes, (2 * 2 * 4 * 8 + 2 * 2 * 4 + 2 * (2 * 2 * 4 * 8)) * 4u);
  c.shared_clustering = true;  // the one op is per-head: shared clustering keeps the step chain
  EXPECT_NE(nn::fast_path_steps(c).back(), ops::Step::cast_attention);
}
