// Attention: finite differences of every step and of every whole layer variant, the
// invariants of ATTENTION.md, padding invariance, and the clustering rules.
#include <cmath>
#include <limits>
#include <set>

#include "nn/attention.h"
#include "ops/attention.h"
#include "ops/clustering.h"
#include "ops/ops.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

// ---------------------------------------------------------------- steps
TEST(AttentionStepGrad, FullAttentionWithMask) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 0, 1, 1, 0, 0}, {2, 4});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::full_attention(x[0], x[1], x[2], mask); },
                   (Inputs{param({2, 2, 4, 3}, 1), param({2, 2, 4, 3}, 2), param({2, 2, 4, 3}, 3)}));
}

TEST(AttentionStepGrad, SurrogateScoresAndProbabilities) {
  Inputs in = {param({2, 3, 5, 4}, 4), param({3, 6, 4}, 5)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::surrogate_scores(x[0], x[1], 0.5); }, in);
  for (auto f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace})
    EXPECT_GRADCHECK([f](const Inputs& x) { return ops::cluster_probabilities(x[0], f); },
                     Inputs{param({2, 3, 5}, 6, -1.0, 2.0)});
}

TEST(AttentionStepGrad, GatedAffinity) {
  Inputs in = {param({2, 5, 6}, 7), param({6, 3}, 8), param({3}, 9), param({2, 3, 5, 4}, 10, 0, 1),
               param({2, 3, 5, 4}, 11, 0, 1)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::gated_affinity(x[0], x[1], x[2], x[3], x[4]); }, in);
}

static Tensor sample_members() {  // (B=1, H=2, C=3, κ=2), with empty slots and an empty cluster
  return Tensor::from_vector<int32_t>({0, 3, 1, -1, -1, -1, 2, 4, 0, 1, 3, -1}, {1, 2, 3, 2});
}

TEST(AttentionStepGrad, IntraClusterAttention) {
  Tensor members = sample_members();
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::intra_cluster_attention(x[0], x[1], x[2], members); },
                   (Inputs{param({1, 2, 5, 3}, 12), param({1, 2, 5, 3}, 13), param({1, 2, 5, 3}, 14)}));
}

TEST(AttentionStepGrad, ClusterSummaries) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 1, 0, 1, 1, 0, 0, 0}, {2, 5});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cluster_summaries(x[0], x[1], mask); },
                   (Inputs{param({2, 2, 5, 3}, 15, 0.1, 1), param({2, 2, 5, 4}, 16)}));
}

TEST(AttentionStepGrad, CombineWithAndWithoutSummaries) {
  Tensor members = sample_members();
  Inputs in = {param({1, 2, 5, 3}, 17, 0, 1), param({1, 2, 3, 2, 4}, 18), param({1, 2, 3, 4}, 19)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters(x[0], x[1], x[2], members); }, in);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::combine_clusters(x[0], x[1], Tensor(), members); },
                   (Inputs{in[0], in[1]}));
}

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

// ---------------------------------------------------------------- clustering rules
TEST(Clustering, SingleAssignmentPlacesEveryRealTokenOnce) {
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    const int64_t G = 3, N = 23, C = 5, kappa = 5;  // C·κ = 25 >= 23
    Tensor aff = Tensor::uniform({G, N, C}, seed, 0);
    std::vector<double> m(N, 1.0);
    m[4] = m[17] = 0.0;
    Tensor mask = Tensor::from_vector<double>(m, {1, N}).to(DType::f32);
    auto ids = ops::cluster_satopk(aff, mask, kappa).to_double_vector();
    for (int64_t g = 0; g < G; ++g) {
      std::multiset<int> seen;
      for (int64_t e = 0; e < C * kappa; ++e)
        if (ids[g * C * kappa + e] >= 0) seen.insert(static_cast<int>(ids[g * C * kappa + e]));
      EXPECT_EQ(seen.size(), 21u);
      for (int i = 0; i < N; ++i) EXPECT_EQ(seen.count(i), (i == 4 || i == 17) ? 0u : 1u) << "token " << i;
    }
  }
}

TEST(Clustering, TopKPicksLargestInPositionOrder) {
  // one group, 5 tokens, 2 clusters, κ = 2; token 4 is padding
  Tensor aff = Tensor::from_vector<float>({0.9f, 0.1f, 0.2f, 0.8f, 0.9f, 0.1f, 0.3f, 0.7f, 1.0f, 1.0f}, {1, 5, 2});
  Tensor mask = Tensor::from_vector<float>({1, 1, 1, 1, 0}, {1, 5});
  expect_values(ops::cluster_topk(aff, mask, 2), {0, 2, 1, 3});  // ties (0.9) toward lower index
  // satopk: best affinities 0.9 (t0), 0.8 (t1), 0.9 (t2), 0.7 (t3): order t0, t2, t1, t3
  expect_values(ops::cluster_satopk(aff, mask, 2), {0, 2, 1, 3});
}

// Top-K against a full sort of each cluster's column by the same order (larger first, NaN
// last, ties toward the earlier token), on columns with many ties, NaN, padding, more clusters
// than one block of the CPU op, and κ below, at and above the real tokens.
TEST(Clustering, TopKEqualsAFullSortOfEachColumn) {
  for (int64_t N : {5, 37, 300, 2000})
    for (int64_t C : {3, 16, 21})
      for (int64_t kappa : {int64_t{1}, N / 3 + 1, N / 40 + 1, N, N + 2}) {
        const int64_t G = 4;
        std::vector<float> a(G * N * C);
        for (size_t e = 0; e < a.size(); ++e) a[e] = static_cast<float>((e * 7919 + N) % 13) / 4.0f;  // ties
        if (N == 2000)  // few ties: values spread over many levels
          for (size_t e = 0; e < a.size(); ++e) a[e] = static_cast<float>((e * 104729 + 7) % 100003) / 1000.0f;
        for (size_t e = 5; e < a.size(); e += 17) a[e] = std::nanf("");
        for (size_t e = 11; e < a.size(); e += 23) a[e] = -std::numeric_limits<float>::infinity();
        if (C == 21)  // a column of NaN and −∞ only, in every group
          for (int64_t i = 0; i < G * N; ++i)
            a[i * C + 20] = i % 3 ? std::nanf("") : -std::numeric_limits<float>::infinity();
        std::vector<float> m(2 * N, 1.0f);
        for (int64_t i = 0; i < N; i += 4) m[i] = 0.0f;  // batch row 0: every fourth token padded
        const Tensor aff = Tensor::from_vector<float>(a, {G, N, C});
        const auto got = ops::cluster_topk(aff, Tensor::from_vector<float>(m, {2, N}), kappa).to_double_vector();
        for (int64_t g = 0; g < G; ++g)
          for (int64_t c = 0; c < C; ++c) {
            std::vector<int64_t> order;
            for (int64_t i = 0; i < N; ++i)
              if (m[(g / 2) * N + i] != 0.0f) order.push_back(i);
            auto value = [&](int64_t i) { return a[(g * N + i) * C + c]; };
            std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
              const bool nx = std::isnan(value(x)), ny = std::isnan(value(y));
              return nx != ny ? ny : (!nx && value(x) > value(y));
            });
            order.resize(std::min<size_t>(order.size(), kappa));
            std::sort(order.begin(), order.end());
            for (int64_t s = 0; s < kappa; ++s)
              ASSERT_EQ(got[(g * C + c) * kappa + s], s < static_cast<int64_t>(order.size()) ? order[s] : -1)
                  << "N " << N << " C " << C << " kappa " << kappa << " group " << g << " cluster " << c << " slot "
                  << s;
          }
      }
}

TEST(Clustering, KMeansAssignsEveryRealQueryAndIsDeterministic) {
  Tensor q = constant({2, 40, 4}, 60, -1, 1, DType::f32);
  Tensor planes = Tensor::normal({16, 5}, 61, 0);
  Tensor hashes = ops::lsh_hash(q, planes);
  Tensor mask = Tensor::from_vector<float>(std::vector<float>(80, 1.0f), {2, 40});
  auto a = ops::hamming_kmeans(hashes, mask, 6, 10, 7).to_double_vector();
  auto b = ops::hamming_kmeans(hashes, mask, 6, 10, 7).to_double_vector();
  EXPECT_EQ(a, b);
  // a mask of no rows, or of the wrong length, is one clear error (no row count divides by 0)
  EXPECT_CAST_ERROR(ops::hamming_kmeans(hashes, Tensor::zeros({0, 40}), 6, 1, 7), "hamming_kmeans: mask");
  EXPECT_CAST_ERROR(ops::hamming_kmeans(hashes, Tensor::zeros({2, 39}), 6, 1, 7), "does not fit");
  for (double c : a) EXPECT_TRUE(c >= 0 && c < 6);
  // queries with identical hashes land in the same cluster
  auto h = hashes.to_double_vector();
  for (size_t i = 0; i < 40; ++i)
    for (size_t j = 0; j < 40; ++j)
      if (h[i] == h[j]) EXPECT_EQ(a[i], a[j]);
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
