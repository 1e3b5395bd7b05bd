// The clustering steps (Top-K, Single-Assignment Top-K, LSH, Hamming k-means): their rules, and the
// GPU's integers against the CPU's.
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

// Affinities on a coarse grid (many exact ties), with -0 beside +0 and NaN.
static Tensor tied_affinities(int64_t groups, int64_t N, int64_t C, uint64_t seed) {
  std::vector<float> values(groups * N * C);
  uint64_t draw = 0;
  for (float& v : values) {
    const double u = philox::uniform(seed, draw++);
    v = static_cast<float>(std::floor(u * 8) / 4 - 1);  // 8 levels: many ties
    if (u < 0.03) v = -0.0f;
    if (u > 0.985) v = std::nanf("");
  }
  return Tensor::from_vector<float>(values, {groups, N, C});
}

// Padding at the end of row 0, every other token of row 1, no real token at all in row 2.
static Tensor awkward_mask(int64_t N) {
  std::vector<float> mask(3 * N, 1.f);
  for (int64_t i = N - N / 3; i < N; ++i) mask[0 * N + i] = 0.f;
  for (int64_t i = 0; i < N; ++i) mask[1 * N + i] = i % 2 ? 1.f : 0.f;
  for (int64_t i = 0; i < N; ++i) mask[2 * N + i] = 0.f;
  return Tensor::from_vector<float>(mask, {3, N});
}

// CAST Top-K and Single-Assignment Top-K on the device pick the CPU op's members bit for bit:
// ties, -0, NaN, padding, a batch row with no real token, and κ below, at and above N, so that
// C·κ falls below, at and above the real tokens.
TEST(CudaVsCpuAttention, ClusteringSelectsTheSameMembers) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 3, H = 2, C = 5;
  for (auto [name, op] : {std::pair{"topk", &ops::cluster_topk}, std::pair{"satopk", &ops::cluster_satopk}})
    for (int64_t N : {7, 40, 300}) {
      for (int64_t kappa : {int64_t{1}, N / C, N / C + 1, N, N + 3}) {
        if (kappa < 1) continue;
        const Tensor affinity = tied_affinities(B * H, N, C, static_cast<uint64_t>(N * 131 + kappa));
        const Tensor m = awkward_mask(N);
        const Tensor cpu = op(affinity, m, kappa);
        const Tensor gpu = op(affinity.to(Device::cuda), m.to(Device::cuda), kappa);
        ASSERT_TRUE(gpu.is_cuda());
        EXPECT_EQ(gpu.to(Device::cpu).to_double_vector(), cpu.to_double_vector())
            << name << ", N " << N << ", kappa " << kappa;
        EXPECT_EQ(op(affinity.to(Device::cuda), Tensor(), kappa).to(Device::cpu).to_double_vector(),
                  op(affinity, Tensor(), kappa).to_double_vector())
            << name << ", N " << N << ", kappa " << kappa << ", no mask";
      }
    }
}

// LSH hashing and Hamming k-means on the device give the CPU op's integers bit for bit: queries
// whose projections land on zero, hashes of few bits (many equal distances: the tie rules
// decide), padding, a row with no real token, and C below, at and above the real tokens (empty
// clusters restart from random queries: the draws must match too).
TEST(CudaVsCpuAttention, HashingAndKMeansAssignTheSameClusters) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 3, H = 2, d = 5;
  for (int64_t N : {9, 64, 257}) {
    Tensor q = rand32({B * H, N, d}, static_cast<uint64_t>(N), -1, 1);
    for (int64_t e = 0; e < q.numel(); e += 7) q.data<float>()[e] = 0.f;  // exact zeros in the sums
    for (int64_t bits : {3, 16, 63}) {
      const Tensor planes = rand32({bits, d + 1}, static_cast<uint64_t>(bits), -1, 1);
      const Tensor cpu_hash = ops::lsh_hash(q, planes);
      const Tensor gpu_hash = ops::lsh_hash(q.to(Device::cuda), planes);
      ASSERT_TRUE(gpu_hash.is_cuda());
      ASSERT_EQ(gpu_hash.to(Device::cpu).to_double_vector(), cpu_hash.to_double_vector())
          << "N " << N << ", bits " << bits;
      const Tensor m = awkward_mask(N);
      for (int64_t C : {int64_t{1}, int64_t{4}, N / 2, N, N + 5})
        for (int64_t iterations : {0, 3}) {
          const uint64_t seed = static_cast<uint64_t>(N * 1000 + C * 10 + iterations);
          const Tensor cpu = ops::hamming_kmeans(cpu_hash, m, C, iterations, seed);
          const Tensor gpu = ops::hamming_kmeans(gpu_hash, m.to(Device::cuda), C, iterations, seed);
          ASSERT_TRUE(gpu.is_cuda());
          EXPECT_EQ(gpu.to(Device::cpu).to_double_vector(), cpu.to_double_vector())
              << "N " << N << ", bits " << bits << ", C " << C << ", iterations " << iterations;
        }
      EXPECT_EQ(ops::hamming_kmeans(gpu_hash, Tensor(), 4, 2, 7).to(Device::cpu).to_double_vector(),
                ops::hamming_kmeans(cpu_hash, Tensor(), 4, 2, 7).to_double_vector())
          << "N " << N << ", no mask";
    }
  }
  // A group longer than one block's chunk of tokens (1024): the counts of several blocks meet in
  // one cluster's atomics, and the votes and restarts read them all.
  const int64_t N = 2500;
  const Tensor q = rand32({B * H, N, d}, 99, -1, 1), planes = rand32({16, d + 1}, 98, -1, 1);
  const Tensor hash = ops::lsh_hash(q, planes), m = awkward_mask(N);
  for (int64_t C : {int64_t{7}, int64_t{40}}) {
    const Tensor cpu = ops::hamming_kmeans(hash, m, C, 4, static_cast<uint64_t>(C));
    const Tensor gpu = ops::hamming_kmeans(hash.to(Device::cuda), m.to(Device::cuda), C, 4, static_cast<uint64_t>(C));
    EXPECT_EQ(gpu.to(Device::cpu).to_double_vector(), cpu.to_double_vector()) << "N " << N << ", C " << C;
  }
}

// The index bookkeeping the clustered ops keep on the device (counts, repeated ids) against the host's.
TEST(CudaVsCpuAttention, ClusterCountsAndRepeatedIds) {
  SKIP_WITHOUT_GPU();
  const Tensor assign = Tensor::from_vector<int32_t>({0, 2, 2, -1, 1, 2, 0, -1, -1, 3, 3, 3}, {3, 4});
  EXPECT_EQ(ops::cluster_counts(assign.to(Device::cuda), 5, DType::f32).to(Device::cpu).to_double_vector(),
            ops::cluster_counts(assign, 5, DType::f32).to_double_vector());
  const Tensor ids = Tensor::from_vector<int32_t>({0, 1, -1, 2, 3, 4}, {2, 3});
  EXPECT_EQ(ops::repeat_for_heads(ids.to(Device::cuda), 3).to(Device::cpu).to_double_vector(),
            ops::repeat_for_heads(ids, 3).to_double_vector());
  EXPECT_EQ(ops::repeat_for_heads(ids, 3).shape(), (Shape{2, 3, 3}));
}
