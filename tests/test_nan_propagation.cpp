// NaN is never hidden: every fused CPU attention kernel gives NaN in exactly the outputs and
// gradients where the step-by-step reference ops give it (math/fast_math.h states the one rule),
// for a NaN among real scores and for a NaN on a padding token or a token in no cluster.
#include <cmath>
#include <functional>

#include "nn/attention.h"
#include "ops/attention/steps.h"
#include "ops/attention/fast_paths.h"
#include "math/fast_math.h"
#include "math/softmax_rule.h"
#include "ops/attention/full_attention_flash.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

namespace {

// `t` with element `flat` set to NaN, as a fresh leaf that requires grad.
Tensor with_nan(const Tensor& t, int64_t flat) {
  auto values = t.to_double_vector();
  values[flat] = std::nan("");
  return Tensor::from_vector<double>(values, t.shape()).to(t.dtype()).set_requires_grad();
}

std::vector<bool> nan_pattern(const Tensor& t) {
  std::vector<bool> p;
  for (double x : t.to_double_vector()) p.push_back(std::isnan(x));
  return p;
}

int64_t count(const std::vector<bool>& p) { return std::count(p.begin(), p.end(), true); }

// The same NaN pattern, element by element; the first differences named.
void expect_same_nans(const Tensor& fused, const Tensor& reference, const std::string& what) {
  const auto f = nan_pattern(fused), r = nan_pattern(reference);
  ASSERT_EQ(f.size(), r.size()) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < f.size(); ++i)
    if (f[i] != r[i] && differ++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << (f[i] ? "NaN" : "finite") << " fused but "
                    << (r[i] ? "NaN" : "finite") << " in the reference";
  EXPECT_EQ(differ, 0) << what << ": " << count(f) << " NaN fused, " << count(r) << " in the reference";
}

// Runs fn on the reference and the fused path; compares the NaN patterns of the output and of
// every input's gradient. Returns the reference output's NaN count (so a case can say whether
// its NaN reaches the output at all).
int64_t compare_nans(const std::function<Tensor(const Inputs&, bool)>& fn, Inputs inputs, const std::string& what) {
  Tensor outs[2];
  std::vector<Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    outs[fused] = fn(inputs, fused == 1);
    autograd::backward(outs[fused], Tensor::uniform(outs[fused].shape(), 77, 0, -1.0, 1.0, outs[fused].dtype()));
    for (Tensor& t : inputs) {
      grads[fused].push_back(t.grad());
      t.reset_grad();
    }
  }
  expect_same_nans(outs[1], outs[0], what + " output");
  for (size_t i = 0; i < inputs.size(); ++i)
    expect_same_nans(grads[1][i], grads[0][i], what + fmt::format(" gradient of input {}", i));
  return count(nan_pattern(outs[0]));
}

Tensor uniform(const Shape& s, uint64_t seed, DType dt) {
  return Tensor::uniform(s, seed, 0, -2.0, 2.0, dt).set_requires_grad();
}

}  // namespace

TEST(NanRule, ExpOfNanIsNanAndMaskedScoresStayZero) {
  // the clamp `x < 0 ? x : 0` once made exp(NaN) = exp(0) = 1
  EXPECT_TRUE(std::isnan(ops::exp_nonpositive(std::nanf(""))));
  float row[4] = {0.5f, std::nanf(""), -std::numeric_limits<float>::infinity(), 0.25f};
  EXPECT_TRUE(std::isnan(softmax_rule::weigh_row(row, 4, 0.5f)));
  EXPECT_TRUE(std::isnan(row[1]));
  EXPECT_EQ(row[2], 0.0f) << "a masked score has probability 0 whatever the shift";
  float masked[2] = {-std::numeric_limits<float>::infinity(), 0.0f};
  softmax_rule::weigh_row(masked, 2, std::nanf(""));
  EXPECT_EQ(masked[0], 0.0f);
  EXPECT_TRUE(std::isnan(masked[1]));
  // the reference softmax: a NaN among real scores makes its row NaN, padding stays 0 (as on CUDA)
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = Tensor::from_vector<double>({1.0, std::nan(""), 2.0, 0.5}, {1, 4}).to(dt);
    Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1}, {1, 4}).to(dt);
    auto y = ops::softmax(x, mask).to_double_vector();
    EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]) && std::isnan(y[3])) << dtype_name(dt);
    EXPECT_EQ(y[2], 0.0) << dtype_name(dt);
  }
}

TEST(NanPropagation, FlashAttentionAsTheReference) {
  // 70 queries and 140 keys: two tiles each way; batch 1 has 30 padded keys at the end
  const int64_t B = 2, H = 2, M = 70, N = 140, d = 4;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor mask = tail_mask(N, {0, 30}, dt);
    const Tensor q = uniform({B, H, M, d}, 1, dt), k = uniform({B, H, N, d}, 2, dt), v = uniform({B, H, N, d}, 3, dt);
    auto fn = [&](const Inputs& x, bool fused) {
      return fused ? ops::flash_attention(x[0], x[1], x[2], mask) : ops::full_attention(x[0], x[1], x[2], mask);
    };
    const int64_t real_key = (0 * H + 1) * N * d + 5 * d + 2, pad_key = (1 * H + 0) * N * d + (N - 3) * d + 1;
    const std::string t = dtype_name(dt);
    EXPECT_GT(compare_nans(fn, {q, with_nan(k, real_key), v}, t + " NaN in a real key"), 0);
    EXPECT_GT(compare_nans(fn, {with_nan(q, (0 * H + 0) * M * d + 66 * d), k, v}, t + " NaN in a query"), 0);
    EXPECT_GT(compare_nans(fn, {q, k, with_nan(v, real_key)}, t + " NaN in a real value"), 0);
    compare_nans(fn, {q, with_nan(k, pad_key), v}, t + " NaN in a padded key");
    compare_nans(fn, {q, k, with_nan(v, pad_key)}, t + " NaN in a padded value");
  }
}

namespace {

// (B, H, C, κ): cluster c of each head holds tokens c·κ … c·κ + κ − 1 but the last slot is
// empty (−1); the tokens from C·κ on sit in no cluster.
Tensor block_members(int64_t B, int64_t H, int64_t C, int64_t kappa) {
  std::vector<int32_t> ids;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < kappa; ++s) ids.push_back(s == kappa - 1 ? -1 : static_cast<int32_t>(c * kappa + s));
  return Tensor::from_vector<int32_t>(ids, {B, H, C, kappa});
}

}  // namespace

TEST(NanPropagation, IntraClusterFusedAsTheReference) {
  const int64_t B = 1, H = 2, N = 40, C = 4, kappa = 6, d = 8;  // tokens 24 … 39 in no cluster
  Tensor members = block_members(B, H, C, kappa);
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor q = uniform({B, H, N, d}, 4, dt), k = uniform({B, H, N, d}, 5, dt), v = uniform({B, H, N, d}, 6, dt);
    auto fn = [&](const Inputs& x, bool fused) {
      return fused ? ops::intra_cluster_attention_fused(x[0], x[1], x[2], members)
                   : ops::intra_cluster_attention(x[0], x[1], x[2], members);
    };
    const int64_t member = 1 * N * d + 7 * d + 3, outsider = 30 * d + 1;
    const std::string t = dtype_name(dt);
    EXPECT_GT(compare_nans(fn, {q, with_nan(k, member), v}, t + " NaN in a member's key"), 0);
    EXPECT_GT(compare_nans(fn, {with_nan(q, member), k, v}, t + " NaN in a member's query"), 0);
    EXPECT_GT(compare_nans(fn, {q, k, with_nan(v, member)}, t + " NaN in a member's value"), 0);
    for (int i = 0; i < 3; ++i) {
      Inputs x{q, k, v};
      x[i] = with_nan(x[i], outsider);
      compare_nans(fn, x, t + fmt::format(" NaN in input {} of a token in no cluster", i));
    }
  }
}

TEST(NanPropagation, ImprovedClusteredFusedAsTheReference) {
  const int64_t B = 1, H = 2, N = 30, C = 3, top = 5, d = 4;
  std::vector<int32_t> assign, keys;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < N; ++i) assign.push_back(i >= 27 ? -1 : static_cast<int32_t>(i % C));  // 27 … 29 padding
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t s = 0; s < top; ++s) keys.push_back(s == top - 1 ? -1 : static_cast<int32_t>(c * 4 + s));
  const Tensor assignment = Tensor::from_vector<int32_t>(assign, {B, H, N}),
               top_keys = Tensor::from_vector<int32_t>(keys, {B, H, C, top});
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor q = uniform({B, H, N, d}, 7, dt), k = uniform({B, H, N, d}, 8, dt), v = uniform({B, H, N, d}, 9, dt);
    const Tensor scores = uniform({B, H, C, N}, 10, dt);
    auto fn = [&](const Inputs& x, bool fused) {
      Tensor a_c = ops::softmax(x[3]);
      return fused ? ops::improved_clustered_output_fused(x[0], x[1], x[2], a_c, top_keys, assignment)
                   : ops::improved_clustered_output(x[0], x[1], x[2], a_c, top_keys, assignment);
    };
    const int64_t top_key = 5 * d + 2, other_key = 20 * d + 1, padding = 28 * d;
    const std::string t = dtype_name(dt);
    EXPECT_GT(compare_nans(fn, {q, with_nan(k, top_key), v, scores}, t + " NaN in a top key"), 0);
    EXPECT_GT(compare_nans(fn, {q, k, with_nan(v, other_key), scores}, t + " NaN in a value outside the top keys"), 0);
    EXPECT_GT(compare_nans(fn, {with_nan(q, 2 * d), k, v, scores}, t + " NaN in a query"), 0);
    EXPECT_GT(compare_nans(fn, {q, k, v, with_nan(scores, 1 * N + 4)}, t + " NaN in a cluster score"), 0);
    for (int i = 0; i < 3; ++i) {
      Inputs x{q, k, v, scores};
      x[i] = with_nan(x[i], padding);
      compare_nans(fn, x, t + fmt::format(" NaN in input {} of a padding token", i));
    }
  }
}

// Whole layers: a NaN in x on a real token, and on a padding token.
class NanLayer : public ::testing::TestWithParam<std::pair<const char*, nn::Mechanism>> {};

TEST_P(NanLayer, FusedAsTheReference) {
  const int64_t B = 2, N = 40, D = 16;
  nn::AttentionConfig c;
  c.mechanism = GetParam().second;
  c.dim = D, c.heads = 2, c.clusters = 4, c.cluster_size = 8, c.topk = 6, c.bits = 16, c.seed = 5;
  c.single_assignment = std::string(GetParam().first) == "cast_satopk";
  Tensor mask = tail_mask(N, {0, 9}, DType::f32);
  const Tensor clean = Tensor::uniform({B, N, D}, 31, 0, -1.0, 1.0, DType::f32);
  for (auto [where, flat] : {std::pair<const char*, int64_t>{"a real token", 7 * D + 3},
                             std::pair<const char*, int64_t>{"a padding token", (N + N - 2) * D + 5}}) {
    Tensor x = with_nan(clean, flat);
    Tensor out[2];
    std::map<std::string, Tensor> grads[2];
    for (int fused = 0; fused < 2; ++fused) {
      c.fused = fused == 1;
      nn::Attention layer(c, DType::f32);
      out[fused] = layer.forward(x, mask).out;
      autograd::backward(out[fused], Tensor::uniform({B, N, D}, 32, 0, -1.0, 1.0, DType::f32));
      grads[fused]["x"] = x.grad();
      x.reset_grad();
      for (auto& [name, p] : layer.parameters()) grads[fused][name] = p.grad();
    }
    const std::string what = fmt::format("{}, NaN on {}", GetParam().first, where);
    expect_same_nans(out[1], out[0], what + ": output");
    for (auto& [name, g] : grads[0]) expect_same_nans(grads[1][name], g, what + ": d" + name);
  }
}

INSTANTIATE_TEST_SUITE_P(Mechanisms, NanLayer,
                         ::testing::Values(std::pair{"full", nn::Mechanism::full},
                                           std::pair{"cast_topk", nn::Mechanism::cast},
                                           std::pair{"cast_satopk", nn::Mechanism::cast},
                                           std::pair{"clustered", nn::Mechanism::clustered},
                                           std::pair{"iclustered", nn::Mechanism::iclustered}),
                         [](const auto& info) { return std::string(info.param.first); });

TEST(NanPropagation, SummariesAndCombineFusedAsTheReference) {
  const int64_t B = 1, H = 2, N = 16, C = 3, kappa = 4, d = 5;  // tokens 12 … 15 in no cluster
  Tensor members = block_members(B, H, C, kappa);
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}, {B, N});
  for (DType dt : {DType::f32, DType::f64}) {
    const std::string t = dtype_name(dt);
    const Tensor m = mask.to(dt);
    const Tensor a_k = Tensor::uniform({B, H, N, C}, 7, 0, 0.1, 1.0, dt).set_requires_grad();  // as a softmax gives
    const Tensor v = uniform({B, H, N, d}, 8, dt);
    auto summaries = [&](const Inputs& x, bool fused) {
      return fused ? ops::cluster_summaries_fused(x[0], x[1], m) : ops::cluster_summaries(x[0], x[1], m);
    };
    const int64_t real = 1 * N * C + 5 * C + 1, padded = 3 * C;
    EXPECT_GT(compare_nans(summaries, {with_nan(a_k, real), v}, t + " summaries: NaN in a real token's affinity"), 0);
    EXPECT_GT(compare_nans(summaries, {a_k, with_nan(v, 5 * d + 2)}, t + " summaries: NaN in a real token's value"), 0);
    compare_nans(summaries, {with_nan(a_k, padded), v}, t + " summaries: NaN in a padded token's affinity");
    compare_nans(summaries, {a_k, with_nan(v, 3 * d)}, t + " summaries: NaN in a padded token's value");

    const Tensor w = uniform({B, H, N, C}, 9, dt), r_intra = uniform({B, H, C, kappa, d}, 10, dt);
    const Tensor r_inter = uniform({B, H, C, d}, 11, dt);
    auto combine = [&](const Inputs& x, bool fused) {
      return fused ? ops::combine_clusters_fused(x[0], x[1], x[2], members)
                   : ops::combine_clusters(x[0], x[1], x[2], members);
    };
    EXPECT_GT(
        compare_nans(combine, {with_nan(w, 4 * C + 1), r_intra, r_inter}, t + " combine: NaN in a member's weight"), 0);
    EXPECT_GT(compare_nans(combine, {w, with_nan(r_intra, 2 * d + 1), r_inter}, t + " combine: NaN in R_intra"), 0);
    EXPECT_GT(compare_nans(combine, {w, r_intra, with_nan(r_inter, d + 3)}, t + " combine: NaN in R_inter"), 0);
    compare_nans(combine, {with_nan(w, 13 * C), r_intra, r_inter}, t + " combine: NaN in an outsider's weight");
  }
}

TEST(NanPropagation, AffinitiesAndGateFusedAsTheReference) {
  const int64_t B = 1, G = 2, N = 9, C = 3, w = 4, D = 5;
  for (DType dt : {DType::f32, DType::f64}) {
    const std::string t = dtype_name(dt);
    const Tensor x = uniform({B, G, N, w}, 12, dt), s = uniform({G, C, w}, 13, dt);
    for (ops::AttentionFn f : {ops::AttentionFn::softmax, ops::AttentionFn::laplace}) {
      const std::string what = t + (f == ops::AttentionFn::softmax ? " softmax" : " laplace");
      auto affinities = [f](const Inputs& in, bool fused) {
        return fused ? ops::cluster_affinities_fused(in[0], in[1], f) : ops::cluster_affinities(in[0], in[1], f);
      };
      EXPECT_GT(compare_nans(affinities, {with_nan(x, 3 * w + 1), s}, what + " affinities: NaN in a token"), 0);
      EXPECT_GT(compare_nans(affinities, {x, with_nan(s, C * w + 2)}, what + " affinities: NaN in a surrogate"), 0);
    }
    const Tensor xs = uniform({B, N, D}, 14, dt), gate_w = uniform({D, G}, 15, dt), gate_b = uniform({G}, 16, dt);
    const Tensor a_q = Tensor::uniform({B, G, N, C}, 17, 0, 0.0, 1.0, dt).set_requires_grad();
    const Tensor a_k = Tensor::uniform({B, G, N, C}, 18, 0, 0.0, 1.0, dt).set_requires_grad();
    auto gate = [](const Inputs& in, bool fused) {
      return fused ? ops::gated_affinity_fused(in[0], in[1], in[2], in[3], in[4])
                   : ops::gated_affinity(in[0], in[1], in[2], in[3], in[4]);
    };
    EXPECT_GT(compare_nans(gate, {with_nan(xs, 2 * D + 1), gate_w, gate_b, a_q, a_k}, t + " gate: NaN in x"), 0);
    EXPECT_GT(compare_nans(gate, {xs, with_nan(gate_w, 1), gate_b, a_q, a_k}, t + " gate: NaN in W"), 0);
    EXPECT_GT(compare_nans(gate, {xs, gate_w, gate_b, with_nan(a_q, N * C + 4), a_k}, t + " gate: NaN in A_q"), 0);
    EXPECT_GT(compare_nans(gate, {xs, gate_w, gate_b, a_q, with_nan(a_k, 5)}, t + " gate: NaN in A_k"), 0);
  }
}
