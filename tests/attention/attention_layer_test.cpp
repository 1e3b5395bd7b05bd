// The whole attention layer: finite differences of every variant, the invariants of ATTENTION.md,
// padding, the drawn weights, the fused layer against the reference layer, and every step and
// variant on CUDA against the CPU.
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

TEST(AttentionStepGrad, Expand) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::expand(x[0], {3, 2, 4}); }, Inputs{param({2, 1}, 29)});
}

// ---------------------------------------------------------------- whole layers
struct LayerCase {
  std::string name;
  nn::AttentionConfig config;
};

static std::vector<LayerCase> all_variants(int64_t dim, int64_t heads, int64_t clusters, int64_t kappa) {
  std::vector<LayerCase> out;
  nn::AttentionConfig base;
  base.dim = dim;
  base.heads = heads;
  base.seed = 3;
  out.push_back({"full", base});
  for (bool sa : {false, true})
    for (auto f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
      for (bool summaries : {true, false})
        for (bool mix_query : {false, true})
          for (bool shared : {false, true}) {
            nn::AttentionConfig c = base;
            c.mechanism = nn::Mechanism::cast;
            c.clusters = clusters;
            c.cluster_size = kappa;
            c.single_assignment = sa;
            c.f = f;
            c.summaries = summaries;
            c.mix_query = mix_query;
            c.shared_clustering = shared;
            out.push_back({fmt::format("cast/{}/{}/summaries-{}/{}/{}", sa ? "satopk" : "topk",
                                       f == ops::AttentionFn::softmax ? "softmax" : "laplace", summaries ? "on" : "off",
                                       mix_query ? "query" : "affinity", shared ? "shared" : "per-head"),
                           c});
          }
  for (auto m : {nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
    nn::AttentionConfig c = base;
    c.mechanism = m;
    c.clusters = clusters;
    c.topk = 3;
    c.bits = 8;
    out.push_back({nn::mechanism_name(m), c});
  }
  return out;
}

// Checks every input and parameter gradient of a layer by finite differences, asserting first
// that no perturbation changes a cluster membership (the indices are constants of backward).
static void check_layer_gradients(const LayerCase& lc, const Tensor& mask) {
  SCOPED_TRACE(lc.name);
  const int64_t B = 2, N = 6;
  nn::Attention layer(lc.config, DType::f64);
  Tensor x = param({B, N, lc.config.dim}, 41);
  nn::AttentionOutput ref = layer.forward(x, mask);
  autograd::clear_tape();
  Tensor assignment = ref.assignment;  // clustered: fixed, so LSH redraws cannot move it
  bool membership_changed = false;
  auto same = [](const Tensor& a, const Tensor& b) {
    return !a.defined() || a.to_double_vector() == b.to_double_vector();
  };
  Inputs inputs = {x};
  std::vector<std::string> names;
  for (auto& [name, t] : layer.parameters()) {
    inputs.push_back(t);
    names.push_back(name);
  }
  auto fn = [&](const Inputs& in) {
    nn::AttentionOutput o = layer.forward(in[0], mask, assignment);
    if (!same(ref.clusters, o.clusters) || !same(ref.top_keys, o.top_keys)) membership_changed = true;
    return o.out;
  };
  auto result = autograd::gradcheck(fn, inputs);
  ASSERT_FALSE(membership_changed) << "a perturbation of ±ε moved a cluster membership: the check is invalid here";
  EXPECT_TRUE(result.ok) << result.report;
  EXPECT_LE(result.max_error, 1e-6) << result.report;
}

TEST(AttentionLayerGrad, EveryVariantWithPadding) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
  for (const LayerCase& lc : all_variants(8, 2, 3, 3)) check_layer_gradients(lc, mask);
}

TEST(AttentionLayerGrad, EveryVariantWithoutMask) {
  for (const LayerCase& lc : all_variants(6, 3, 2, 4)) check_layer_gradients(lc, Tensor());
}

// ---------------------------------------------------------------- invariants
static Tensor full_reference(const nn::Attention& like, const Tensor& x, const Tensor& mask) {
  nn::AttentionConfig c = like.config();
  c.mechanism = nn::Mechanism::full;
  nn::Attention full(c, x.dtype());
  for (const char* n : {"wq", "wk", "wv", "wo"})
    full.parameters()[n] = const_cast<nn::Attention&>(like).parameters().at(n);
  return full.forward(x, mask).out;
}

TEST(AttentionInvariants, ImprovedClusteredWithAllKeysEqualsFull) {
  nn::AttentionConfig c;
  c.mechanism = nn::Mechanism::iclustered;
  c.dim = 8;
  c.heads = 2;
  c.clusters = 3;
  c.topk = 7;
  c.bits = 16;
  nn::Attention layer(c, DType::f64);
  Tensor x = constant({2, 7, 8}, 50);
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 7});
  EXPECT_LT(max_abs_diff(layer.forward(x, mask).out, full_reference(layer, x, mask)), 1e-12);
}

TEST(AttentionInvariants, CastWithOneClusterHoldingEveryTokenEqualsFull) {
  for (bool sa : {false, true})
    for (auto f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
      for (bool shared : {false, true}) {
        nn::AttentionConfig c;
        c.mechanism = nn::Mechanism::cast;
        c.dim = 8;
        c.heads = 2;
        c.clusters = 1;
        c.cluster_size = 7;
        c.single_assignment = sa;
        c.f = f;
        c.shared_clustering = shared;
        nn::Attention layer(c, DType::f64);
        Tensor x = constant({2, 7, 8}, 51);
        Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 7});
        EXPECT_LT(max_abs_diff(layer.forward(x, mask).out, full_reference(layer, x, mask)), 1e-12);
      }
}

TEST(AttentionInvariants, ClusteredWithEveryQueryItsOwnClusterEqualsFull) {
  for (auto m : {nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
    nn::AttentionConfig c;
    c.mechanism = m;
    c.dim = 8;
    c.heads = 2;
    c.topk = 2;  // improved: T_j holds 2 keys, the rest is carried exactly by A^c
    nn::Attention layer(c, DType::f64);
    Tensor x = constant({2, 5, 8}, 52);
    std::vector<int32_t> own;
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 5; ++i) own.push_back(i);
    Tensor assignment = Tensor::from_vector<int32_t>(own, {2, 2, 5});
    EXPECT_LT(max_abs_diff(layer.forward(x, Tensor(), assignment).out, full_reference(layer, x, Tensor())), 1e-12)
        << nn::mechanism_name(m);
  }
}

TEST(AttentionInvariants, AppendingPaddingChangesNoRealOutput) {
  const int64_t B = 2, N = 6, pad = 3, D = 8;
  Tensor x = constant({B, N, D}, 53);
  Tensor x_padded = ops::concat({x, constant({B, pad, D}, 54, -5, 5)}, 1);
  std::vector<double> m(B * (N + pad), 0.0), m_short(B * N, 1.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < N; ++i) m[b * (N + pad) + i] = 1.0;
  Tensor mask = Tensor::from_vector<double>(m, {B, N + pad}), mask_short = Tensor::from_vector<double>(m_short, {B, N});
  for (const LayerCase& lc : all_variants(D, 2, 3, 3)) {
    SCOPED_TRACE(lc.name);
    nn::Attention a(lc.config, DType::f64), b(lc.config, DType::f64);  // same seed: same parameters
    Tensor out_short = a.forward(x, mask_short).out;
    Tensor out_long = b.forward(x_padded, mask).out;
    Tensor real_part = ops::split(out_long, {N, pad}, 1)[0];
    EXPECT_LT(max_abs_diff(real_part, out_short), 1e-12);
    expect_values(ops::split(out_long, {N, pad}, 1)[1], std::vector<double>(B * pad * D, 0.0));
  }
}

TEST(AttentionInvariants, PaddingReceivesNoGradient) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 0, 0}, {1, 6});
  for (const LayerCase& lc : all_variants(8, 2, 2, 3)) {
    SCOPED_TRACE(lc.name);
    nn::Attention layer(lc.config, DType::f64);
    Tensor x = param({1, 6, 8}, 55);
    Tensor out = layer.forward(x, mask).out;
    autograd::backward(out, Tensor::full(out.shape(), 1.0, DType::f64));
    auto g = x.grad().to_double_vector();
    for (int64_t i = 4 * 8; i < 6 * 8; ++i) EXPECT_EQ(g[i], 0.0) << "element " << i;
  }
}

// ---------------------------------------------------------------- the weights `cast attention` draws

// Attention::weights (identity values, d columns at a time) against what the layer outputs:
// merging the heads of W·V and projecting by wo gives the forward's output, for every mechanism
// (clustered ones with a fixed assignment, so both passes cluster alike); each real query's row
// is a distribution over the real keys (CAST's: zero on padded keys).
TEST(AttentionWeights, WeightsTimesValuesIsTheLayersOutput) {
  const int64_t B = 2, N = 11, D = 8, H = 2, d = D / H;  // 11 keys: three passes of 4 columns, the last short
  for (bool fused : {true, false})
    for (auto m : {nn::Mechanism::full, nn::Mechanism::cast, nn::Mechanism::clustered, nn::Mechanism::iclustered}) {
      nn::AttentionConfig c;
      c.mechanism = m;
      c.dim = D, c.heads = H, c.clusters = 3, c.cluster_size = 5, c.topk = 3, c.bits = 16;
      c.fused = fused;
      nn::Attention layer(c, DType::f64);
      const Tensor x = constant({B, N, D}, 60);
      std::vector<double> mask_values(B * N, 1.0);
      for (int64_t i = 8; i < N; ++i) mask_values[N + i] = 0.0;  // the second row: 8 real tokens
      const Tensor mask = Tensor::from_vector<double>(mask_values, {B, N});
      // the clustered variants draw new LSH planes each pass: one assignment serves both sides
      const bool hashes = m == nn::Mechanism::clustered || m == nn::Mechanism::iclustered;
      const Tensor assignment = hashes ? layer.forward(x, mask).assignment : Tensor();
      const Tensor weights = layer.weights(x, mask, assignment);
      ASSERT_EQ(weights.shape(), (Shape{B, H, N, N}));
      const auto w = weights.to_double_vector();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t q = 0; q < (b == 0 ? N : 8); ++q) {
            double sum = 0, padded = 0;
            for (int64_t k = 0; k < N; ++k)
              (mask_values[b * N + k] != 0 ? sum : padded) += w[((b * H + h) * N + q) * N + k];
            // CAST mixes clusters by affinities that need not sum to 1: only its zeros are checked
            if (m != nn::Mechanism::cast)
              EXPECT_NEAR(sum, 1.0, 1e-12) << nn::mechanism_name(m) << " row " << b << "," << h << "," << q;
            EXPECT_NEAR(padded, 0.0, 1e-12) << nn::mechanism_name(m);
          }
      // the forward's output from the weights: out = merge_heads(W · (x wv)) wo, zero where padded
      const Tensor out = layer.forward(x, mask, assignment).out;
      const Tensor v =
          ops::permute(ops::reshape(ops::matmul(x, layer.parameters().at("wv")), {B, N, H, d}), {0, 2, 1, 3});
      const Tensor heads = ops::matmul(weights, v);  // (B, H, N, d)
      const Tensor merged = ops::reshape(ops::permute(heads, {0, 2, 1, 3}), {B, N, D});
      const Tensor expected = ops::mul(ops::matmul(merged, layer.parameters().at("wo")), ops::reshape(mask, {B, N, 1}));
      EXPECT_LT(max_abs_diff(out, expected), 1e-12) << nn::mechanism_name(m);
      if (!hashes) continue;
      // without an assignment, the first pass clusters and every pass uses it: a twin layer's
      // first forward draws the same planes, so its assignment gives the same weights
      nn::Attention fresh(c, DType::f64), twin(c, DType::f64);
      for (const char* n : {"wq", "wk", "wv", "wo"})
        fresh.parameters()[n] = twin.parameters()[n] = layer.parameters()[n];
      const Tensor own = fresh.weights(x, mask);
      const nn::AttentionOutput first = twin.forward(x, mask);
      EXPECT_LT(max_abs_diff(own, fresh.weights(x, mask, first.assignment)), 1e-12) << nn::mechanism_name(m);
      // and the study leaves the layer's next forward as it was: its first draw, the twin's
      EXPECT_LT(max_abs_diff(fresh.forward(x, mask).out, first.out), 1e-12) << nn::mechanism_name(m);
    }
}

// ---------------------------------------------------------------- whole layers: fused vs reference
struct FusedLayerCase {
  const char* name;
  nn::Mechanism mechanism;
  bool single_assignment;
};

class FusedLayer : public ::testing::TestWithParam<FusedLayerCase> {};

// On a long sequence with one row padded, and on a short one where a cluster of κ 6 outnumbers
// the 5 tokens. There every Top-K cluster holds every real token, so each R_intra row is full
// attention's and the output, Σ_c W[i,c] R_intra[c][i] with Σ_c W[i,c] = 1, is full attention:
// the gate and the surrogates get no gradient, on either path, but for rounding.
TEST_P(FusedLayer, MatchesReferenceLayer) {
  const FusedLayerCase lc = GetParam();
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
                         ::testing::Values(FusedLayerCase{"full", nn::Mechanism::full, false},
                                           FusedLayerCase{"cast_topk", nn::Mechanism::cast, false},
                                           FusedLayerCase{"cast_satopk", nn::Mechanism::cast, true},
                                           FusedLayerCase{"clustered", nn::Mechanism::clustered, false},
                                           FusedLayerCase{"iclustered", nn::Mechanism::iclustered, false}),
                         [](const ::testing::TestParamInfo<FusedLayerCase>& info) { return info.param.name; });

TEST(CudaVsCpuAttention, Steps) {
  SKIP_WITHOUT_GPU();
  Tensor mask = Tensor::from_vector<float>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 8});
  Inputs qkv = {rand32({2, 2, 8, 4}, 1), rand32({2, 2, 8, 4}, 2), rand32({2, 2, 8, 4}, 3)};
  expect_devices_agree([&](const Inputs& x) { return ops::full_attention(x[0], x[1], x[2], on(mask, x[0])); }, qkv);
  expect_devices_agree([](const Inputs& x) { return ops::surrogate_scores(x[0], x[1], 0.5); },
                       Inputs{qkv[0], rand32({2, 3, 4}, 4)});
  for (auto f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
    expect_devices_agree([f](const Inputs& x) { return ops::cluster_probabilities(x[0], f); },
                         Inputs{rand32({2, 2, 8, 3}, 5)});
  Tensor members = Tensor::from_vector<int32_t>({0, 3, 5, 1, 2, -1, 4, 6, 7,  0, 1, 2, 3, 4, 5, 6,  7,  -1,
                                                 0, 2, 4, 1, 3, 5,  6, 7, -1, 0, 1, 2, 3, 4, 5, -1, -1, -1},
                                                {2, 2, 3, 3});
  expect_devices_agree(
      [&](const Inputs& x) { return ops::intra_cluster_attention(x[0], x[1], x[2], on(members, x[0])); }, qkv);
  expect_devices_agree([&](const Inputs& x) { return ops::cluster_summaries(x[0], x[1], on(mask, x[0])); },
                       Inputs{rand32({2, 2, 8, 3}, 6, 0.1, 1), qkv[2]});
  expect_devices_agree([&](const Inputs& x) { return ops::combine_clusters(x[0], x[1], x[2], on(members, x[0])); },
                       Inputs{rand32({2, 2, 8, 3}, 7, 0, 1), rand32({2, 2, 3, 3, 4}, 8), rand32({2, 2, 3, 4}, 9)});
  expect_devices_agree([](const Inputs& x) { return ops::gated_affinity(x[0], x[1], x[2], x[3], x[4]); },
                       Inputs{rand32({2, 8, 6}, 10), rand32({6, 2}, 11), rand32({2}, 12),
                              rand32({2, 2, 8, 3}, 13, 0, 1), rand32({2, 2, 8, 3}, 14, 0, 1)});
  Tensor assign = Tensor::from_vector<int32_t>(
      {0, 1, 0, 2, 1, 1, 0, 2, 2, 2, 1, 0, 0, 1, -1, -1, 0, 0, 1, 1, 2, 2, 0, 1, 1, 0, 2, 2, 1, 0, -1, -1}, {2, 2, 8});
  expect_devices_agree([&](const Inputs& x) { return ops::cluster_centroids(x[0], on(assign, x[0]), 3); },
                       Inputs{qkv[0]});
  expect_devices_agree([&](const Inputs& x) { return ops::centroid_attention(x[0], x[1], on(mask, x[0])); },
                       Inputs{rand32({2, 2, 3, 4}, 15), qkv[1]});
  Tensor top = Tensor::from_vector<int32_t>({0, 3, 1, 2, 5, 4, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, -1, -1},
                                            {2, 2, 3, 2});
  expect_devices_agree(
      [&](const Inputs& x) {
        return ops::improved_clustered_output(x[0], x[1], x[2], ops::softmax(x[3]), on(top, x[0]), on(assign, x[0]));
      },
      Inputs{qkv[0], qkv[1], qkv[2], rand32({2, 2, 3, 8}, 16)});
}

TEST(CudaVsCpuAttention, EveryLayerVariant) {
  SKIP_WITHOUT_GPU();
  Tensor mask =
      Tensor::from_vector<float>({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0}, {2, 12});
  for (auto m : {nn::Mechanism::full, nn::Mechanism::cast, nn::Mechanism::clustered, nn::Mechanism::iclustered})
    for (bool sa : {false, true})
      for (bool shared : {false, true}) {
        nn::AttentionConfig c;
        c.mechanism = m;
        c.dim = 16;
        c.heads = 2;
        c.clusters = 4;
        c.cluster_size = 4;
        c.single_assignment = sa;
        c.shared_clustering = shared;
        c.topk = 4;
        c.bits = 16;
        nn::Attention cpu_layer(c, DType::f32, Device::cpu), gpu_layer(c, DType::f32, Device::cuda);
        Tensor x = rand32({2, 12, 16}, 10);
        // clustered: both devices use the assignment the CPU computed
        Tensor assignment = cpu_layer.forward(x, mask).assignment;
        autograd::clear_tape();
        SCOPED_TRACE(fmt::format("{} satopk {} shared {}", nn::mechanism_name(m), sa, shared));
        expect_devices_agree(
            [&](const Inputs& in) {
              nn::Attention& layer = in[0].is_cuda() ? gpu_layer : cpu_layer;
              return layer.forward(in[0], on(mask, in[0]), assignment.defined() ? on(assignment, in[0]) : Tensor()).out;
            },
            Inputs{x}, 1e-5, [&](Device device) {  // and the gradient of every parameter
              std::vector<std::pair<std::string, Tensor>> grads;
              for (auto& [name, p] : (device == Device::cuda ? gpu_layer : cpu_layer).parameters())
                grads.push_back({"gradient of " + name, p.grad()});
              return grads;
            });
      }
}

// A mask or member list on another device than q is one clear error, not a fault in a kernel.
TEST(CudaVsCpuAttention, FusedOpsRefuseInputsOnAnotherDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Tensor::uniform({1, 1, 8, 4}, 1, 0, -1.0, 1.0, DType::f32, Device::cuda);
  const Tensor host_mask = Tensor::full({1, 8}, 1.0);
  EXPECT_CAST_ERROR(ops::flash_attention(q, q, q, host_mask), "flash_attention: tensors on different devices");
  EXPECT_CAST_ERROR(
      ops::flash_attention(q.to(Device::cpu), q.to(Device::cpu), q.to(Device::cpu), host_mask.to(Device::cuda)),
      "flash_attention: tensors on different devices");
  const Tensor members = Tensor::from_vector<int32_t>({0, 1, 2, 3}, {1, 1, 1, 4});
  EXPECT_CAST_ERROR(ops::intra_cluster_attention_fused(q, q, q, members),
                    "intra_cluster_attention_fused: tensors on different devices");
}
