// Layer 2 for attention: every step and every layer variant on CUDA against the CPU.
// Skipped, with the reason, where no GPU is present.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/fast.h"
#include "ops/clustering.h"
#include "ops/flash_attention.h"
#include "tensor/philox.h"
#include "tensor/precision.h"
#include "ops/attention.h"
#include "tests/device_compare.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

static Tensor on(const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; }

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
}

// Improved clustered attention on the GPU runs its top-key term fused (no per-query copies of
// K_T, V_T): values and every gradient against the CPU's step composition, with empty slots, a
// cluster with no key, keys shared by several clusters, unassigned (padded) queries, an empty
// cluster, and a head width that is not a multiple of anything.
TEST(CudaVsCpuAttention, ImprovedClusteredTopKeysFused) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, H = 2, N = 37, C = 5, top = 6, d = 12;
  std::vector<int32_t> assign(B * H * N), keys(B * H * C * top);
  uint64_t draw = 0;
  for (int64_t g = 0; g < B * H; ++g) {
    for (int64_t i = 0; i < N; ++i)  // cluster 4 stays empty; the last 5 queries of row 1 are padding
      assign[g * N + i] = g / H == 1 && i >= N - 5 ? -1 : static_cast<int32_t>(philox::uniform(3, draw++) * 4);
    for (int64_t j = 0; j < C; ++j)
      for (int64_t t = 0; t < top; ++t) {
        const double u = philox::uniform(4, draw++);
        keys[(g * C + j) * top + t] = j == 2 ? -1 : u < 0.2 ? -1 : static_cast<int32_t>(u * 10);  // keys 0..9: shared
      }
  }
  const Tensor assignment = Tensor::from_vector<int32_t>(assign, {B, H, N});
  const Tensor top_keys = Tensor::from_vector<int32_t>(keys, {B, H, C, top});
  expect_devices_agree(
      [&](const Inputs& x) {
        // the GPU's fast path against the CPU's step composition (keys listed twice in a cluster are
        // the reference's to take; the CPU's fused kernel refuses them)
        const std::vector<Tensor> in{x[0], x[1], x[2], ops::softmax(x[3]), on(top_keys, x[0]), on(assignment, x[0])};
        return x[0].is_cuda() ? ops::run_step(ops::Step::improved_clustered_output, /*fast=*/true, in)
                              : ops::run_reference(ops::Step::improved_clustered_output, in);
      },
      Inputs{rand32({B, H, N, d}, 31), rand32({B, H, N, d}, 32), rand32({B, H, N, d}, 33), rand32({B, H, C, N}, 34)});
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
    return ops::run_step(ops::Step::combine_clusters, /*fast=*/true, {x[0], x[1], r_inter, on(members, x[0])});
  };
  expect_devices_agree([&](const Inputs& x) { return combine(x, x[2]); }, inputs);
  expect_devices_agree([&](const Inputs& x) { return combine(x, Tensor()); }, Inputs{inputs[0], inputs[1]});
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
    return ops::run_step(ops::Step::cluster_summaries, /*fast=*/true, {x[0], x[1], m});
  };
  expect_devices_agree([&](const Inputs& x) { return summaries(x, on(mask, x[0])); },
                       Inputs{rand32({B, H, N, C}, 51, 0.05, 1), rand32({B, H, N, d}, 52)});
  expect_devices_agree([&](const Inputs& x) { return summaries(x, Tensor()); },
                       Inputs{rand32({B, H, N, C}, 53, 0.05, 1), rand32({B, H, N, d}, 54)});
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

// Flash attention on the device against the CPU's (itself tested against the step ops): values,
// dQ, dK and dV, on every compiled head-width bound (32, 64, 128) and widths between them (13
// and 100 take the scalar loads: d % 4 ≠ 0 or a partial column group), tiles of 64 and 32 rows
// left partial on both sides, M ≠ N (clustered attention's centroids), padding keys and a batch
// row with no real key.
TEST(CudaVsCpuAttention, FlashAttention) {
  SKIP_WITHOUT_GPU();
  for (auto [M, N, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {37, 45, 8}, {5, 70, 40}, {64, 64, 16}, {70, 130, 13}, {65, 33, 64}, {33, 66, 128}, {9, 40, 100}}) {
    std::vector<float> m(3 * N, 1.f);
    for (int64_t j = N - N / 4; j < N; ++j) m[j] = 0.f;  // padding at the end of row 0
    for (int64_t j = 0; j < N; j += 3) m[N + j] = 0.f;   // scattered padding in row 1
    for (int64_t j = 0; j < N; ++j) m[2 * N + j] = 0.f;  // row 2: no real key at all
    const Tensor mask = Tensor::from_vector<float>(m, {3, N});
    expect_devices_agree(
        [&](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], on(mask, x[0])); },
        Inputs{rand32({3, 2, M, d}, 70 + M), rand32({3, 2, N, d}, 71 + N), rand32({3, 2, N, d}, 72 + d)});
    expect_devices_agree([&](const Inputs& x) { return ops::flash_attention(x[0], x[1], x[2], Tensor()); },
                         Inputs{rand32({1, 3, M, d}, 73), rand32({1, 3, N, d}, 74), rand32({1, 3, N, d}, 75)});
  }
}

// NaN as the reference step ops treat it (ops/softmax.cpp and the products around it): a NaN
// among a row's real scores makes that row NaN, in the output and in every gradient it reaches;
// a NaN in a padding key's row of K stays out of the forward but reaches dQ through dS·K, and one
// in a padding row of V reaches the output through P·V (0 · NaN) but not Δ. The device's flash
// kernels against the reference, NaN for NaN, with the NaN in K or V, on a real or a padding key,
// at every precision (the FMA kernels at fp32, the tensor-core kernels at tf32 and bf16).
TEST(CudaVsCpuAttention, FlashAttentionPropagatesNaNAsTheReference) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 1, H = 1, N = 70, d = 16;
  std::vector<float> m(N, 1.f);
  for (int64_t j = 60; j < N; ++j) m[j] = 0.f;
  const Tensor mask = Tensor::from_vector<float>(m, {B, N});
  for (const Precision precision : {Precision::fp32, Precision::tf32, Precision::bf16})
  for (const int which : {1, 2})  // the NaN in k, then in v
    for (const bool on_padding : {false, true}) {
      Inputs in{rand32({B, H, N, d}, 90), rand32({B, H, N, d}, 91), rand32({B, H, N, d}, 92)};
      const std::vector<double> values = in[which].to_double_vector();
      std::vector<float> poisoned(values.begin(), values.end());
      poisoned[(on_padding ? 65 : 3) * d + 5] = std::nanf("");  // key 3 is real, key 65 is padding
      in[which] = Tensor::from_vector<float>(poisoned, in[which].shape()).set_requires_grad();
      auto nan_pattern = [&](bool flash, Device device) {
        Inputs x = copy_inputs(in, device);
        const Tensor mk = mask.to(device);
        PrecisionGuard at(flash ? precision : Precision::fp32);
        Tensor out = flash ? ops::flash_attention(x[0], x[1], x[2], mk) : ops::full_attention(x[0], x[1], x[2], mk);
        autograd::backward(out, Tensor::uniform(out.shape(), 93, 0, -1.0, 1.0).to(device));
        std::vector<std::vector<bool>> pattern;
        for (const Tensor& t : {out, x[0].grad(), x[1].grad(), x[2].grad()}) {
          std::vector<bool> nan;
          for (double v : t.to_double_vector()) nan.push_back(std::isnan(v));
          pattern.push_back(nan);
        }
        return pattern;
      };
      const auto reference = nan_pattern(false, Device::cpu), device = nan_pattern(true, Device::cuda);
      const char* names[] = {"output", "dq", "dk", "dv"};
      for (int t = 0; t < 4; ++t)
        EXPECT_EQ(device[t], reference[t]) << names[t] << ": NaN in " << (which == 1 ? "k" : "v") << " of a "
                                           << (on_padding ? "padding" : "real") << " key, at "
                                           << precision_name(precision);
      // the forward never looks at a padding key's scores
      if (which == 1)
        EXPECT_EQ(std::find(reference[0].begin(), reference[0].end(), true) != reference[0].end(), !on_padding);
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
          return ops::run_step(ops::Step::intra_cluster_attention, /*fast=*/true,
                               {x[0], x[1], x[2], on(members, x[0])});
        },
        Inputs{rand32({B, H, N, d}, 80 + kappa), rand32({B, H, N, d}, 81 + kappa), rand32({B, H, N, d}, 82 + kappa)});
  }
}
