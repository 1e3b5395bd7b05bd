// CAST steps 1–3 and 5–7 as one op: finite differences in every setting, the op against the chain
// of step ops, and what the layer keeps when it runs it.
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
#include "ops/attention/cast_chain.h"
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
#include "tests/devices.h"
#include "tests/random_clusters.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

// ---------------------------------------------------------------- CAST steps 1–3 and 5–7 in one op
namespace {

ops::CastOptions cast_options(int variant) {  // every combination of f, summaries and mixing weights
  return {variant & 1 ? ops::AttentionFn::laplace : ops::AttentionFn::softmax, (variant & 2) == 0, (variant & 4) != 0};
}

std::string describe(const ops::CastOptions& o) {
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
    const ops::CastOptions o = cast_options(variant);
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
        const ops::CastOptions o = cast_options(variant);
        const std::string what =
            fmt::format("B{} H{} N{} C{} kappa{} d{} D{} {} {}", B, H, N, C, kappa, d, D, describe(o), dtype_name(dt));
        Inputs x{make({B, N, D}, 1),    make({D, H}, 2),       make({H}, 3),      make({B, H, N, d}, 4),
                 make({B, H, N, d}, 5), make({B, H, N, d}, 6), make({H, C, d}, 7)};
        const Tensor dout = Tensor::uniform({B, H, N, d}, 77, 0, -1.0, 1.0, dt);
        Tensor outs[2];
        std::vector<Tensor> grads[2];
        for (int fused = 0; fused < 2; ++fused) {
          const Tensor g = ops::cast_gate(x[0], x[1], x[2]);
          outs[fused] = fused
                            ? ops::cast_attention_fused(g, x[3], x[4], x[5], x[6], mask, members, o)
                            : ops::run_reference(ops::CastAttentionInputs{g, x[3], x[4], x[5], x[6], mask, members, o});
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

namespace {
// A small CAST layer's config: B 2, N 30, D 16, 2 heads, C 4, κ 8.
nn::AttentionConfig small_cast_layer() {
  nn::AttentionConfig c;
  c.mechanism = nn::Mechanism::cast;
  c.dim = 16, c.heads = 2, c.clusters = 4, c.cluster_size = 8, c.seed = 3;
  return c;
}

struct SavedBytes final : autograd::FieldVisitor {
  size_t bytes = 0;
  void input(const char*, const Tensor&) override {}
  void saved(const char*, const Tensor& t) override { bytes += t.defined() ? t.nbytes() : 0; }
};

// What the node named `op` on the tape of the layer's forward saves, in bytes (-1: no such node);
// the tape is cleared.
int64_t saved_by(const nn::AttentionConfig& c, Device device, const std::string& op) {
  nn::Attention layer(c, DType::f32, device);
  Tensor x = Tensor::uniform({2, 30, 16}, 4, 0, -1.0, 1.0, DType::f32).to(device).set_requires_grad();
  Tensor out = layer.forward(x, Tensor()).out;
  int64_t saved = -1;
  autograd::for_each_node([&](const autograd::Node& node) {
    if (node.name() != op) return;
    SavedBytes count;
    node.fields(count);
    saved = static_cast<int64_t>(count.bytes);
  });
  autograd::clear_tape();
  return saved;
}
}  // namespace

// The layer runs the one op where it fits and keeps no (B, H, N, C) tensor for the backward:
// the tape of a CAST layer with fast paths on saves none of A_q, A_k, A_g, P or R_intra.
TEST(CastAttentionFused, TheLayerRunsItAndItsTapeKeepsNoAffinities) {
  nn::AttentionConfig c = small_cast_layer();
  EXPECT_EQ(nn::fast_path_steps(c).back(), ops::Step::cast_attention);
  // R_inter (2, 2, 4, 8), the column sums (2, 2, 4), the slots' log-sum-exp and mixing weights
  // (2, 2, 4, 8) each, 4 bytes each (the gate g is an input)
  EXPECT_EQ(saved_by(c, Device::cpu, "cast_attention_fused"), (2 * 2 * 4 * 8 + 2 * 2 * 4 + 2 * (2 * 2 * 4 * 8)) * 4);
  c.shared_clustering = true;  // the one op is per-head: shared clustering keeps the step chain
  EXPECT_NE(nn::fast_path_steps(c).back(), ops::Step::cast_attention);
}

// On the GPU the layer runs cast_attention_recompute, which keeps the clusters alone: the chain's
// A_q, A_k, A_g and R_intra are formed again in its backward.
TEST(CastAttentionRecompute, TheGpuLayerRunsItAndItsTapeKeepsOnlyTheClusters) {
  if (devices_here().back() != Device::cuda) GTEST_SKIP() << "no CUDA device in this build";
  nn::AttentionConfig c = small_cast_layer();
  EXPECT_EQ(nn::fast_path_steps(c, Device::cuda).back(), ops::Step::cast_attention);
  EXPECT_EQ(saved_by(c, Device::cuda, "cast_attention_recompute"), 2 * 2 * 4 * 8 * 4);  // members (2, 2, 4, 8) i32
  c.single_assignment = true;  // the clusters chosen first, without a gradient; the op keeps the same
  EXPECT_EQ(saved_by(c, Device::cuda, "cast_attention_recompute"), 2 * 2 * 4 * 8 * 4);
}

// The op's backward walks a tape of its own in the middle of the layer's backward: what the
// layer recorded before it (the projections) still gets its gradient, and the GPU layer's
// gradients equal the CPU layer's.
TEST(CastAttentionRecompute, TheLayersBackwardGoesOnPastIt) {
  if (devices_here().back() != Device::cuda) GTEST_SKIP() << "no CUDA device in this build";
  const nn::AttentionConfig c = small_cast_layer();
  std::vector<std::vector<double>> grads;
  for (Device device : {Device::cpu, Device::cuda}) {
    nn::Attention layer(c, DType::f32, device);
    Tensor x = Tensor::uniform({2, 30, 16}, 4, 0, -1.0, 1.0, DType::f32).to(device).set_requires_grad();
    Tensor out = layer.forward(x, Tensor()).out;
    autograd::backward(out, Tensor::uniform(out.shape(), 5, 0, -1.0, 1.0, DType::f32).to(device));
    EXPECT_EQ(autograd::tape_size(), 0u);
    grads.push_back(x.grad().to_double_vector());
    nn::ParamList params;
    layer.collect_parameters(params, "");
    for (const auto& [name, t] : params) {  // every parameter's gradient too, the surrogates' and the gate's included
      ASSERT_TRUE(t->grad().defined()) << name;
      const std::vector<double> g = t->grad().to_double_vector();
      grads.back().insert(grads.back().end(), g.begin(), g.end());
    }
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_NEAR(grads[1][i], grads[0][i], 1e-4) << "element " << i;
}

// A backward run in a separate tape leaves the tape outside as it was.
TEST(SeparateTape, LeavesTheOuterTapeAsItWas) {
  Tensor a = Tensor::uniform({3}, 1, 0, -1.0, 1.0, DType::f64).set_requires_grad();
  Tensor outer = ops::mul(a, a);
  const size_t recorded = autograd::tape_size();
  {
    autograd::NoGradGuard off;  // recording is on inside, whatever it is outside
    autograd::SeparateTape own;
    Tensor b = a.view(a.shape()).set_requires_grad();
    Tensor inner = ops::mul(b, b);
    EXPECT_EQ(autograd::tape_size(), 1u);
    autograd::backward(ops::sum(inner, 0));
    EXPECT_TRUE(b.grad().defined());
    EXPECT_FALSE(a.grad().defined());
  }
  EXPECT_EQ(autograd::tape_size(), recorded);
  autograd::backward(ops::sum(outer, 0));
  const std::vector<double> x = a.to_double_vector(), g = a.grad().to_double_vector();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_DOUBLE_EQ(g[i], 2 * x[i]);
}

// ---------------------------------------------------------------- CAST's chain, written once
// The chain runs the steps that cast_chain_steps lists (what the memory estimate counts), in that
// order, with summaries on and off.
TEST(CastChain, RunsTheStepsItLists) {
  for (bool summaries : {true, false}) {
    ops::CastChainInputs in;
    in.q = Tensor::uniform({1, 2, 6, 3}, 1, 0, -1.0, 1.0, DType::f64);
    in.k = Tensor::uniform({1, 2, 6, 3}, 2, 0, -1.0, 1.0, DType::f64);
    in.v = Tensor::uniform({1, 2, 6, 3}, 3, 0, -1.0, 1.0, DType::f64);
    in.s = Tensor::uniform({2, 2, 3}, 4, 0, -1.0, 1.0, DType::f64);
    in.x = Tensor::uniform({1, 6, 6}, 5, 0, -1.0, 1.0, DType::f64);
    in.gate_w = Tensor::uniform({6, 2}, 6, 0, -1.0, 1.0, DType::f64);
    in.gate_b = Tensor::zeros({2}, DType::f64);
    in.options.summaries = summaries;
    std::vector<ops::Step> ran;
    const ops::StepRunner record = [&](const ops::StepInputs& step) {
      ran.push_back(ops::step_of(step));
      return ops::run_reference(step);
    };
    const ops::CastChain c = ops::cast_chain(in, record, ops::choose_clusters(Tensor(), 3, false));
    EXPECT_EQ(ran, ops::cast_chain_steps(in.options)) << "summaries " << summaries;
    EXPECT_EQ(c.members.shape(), (Shape{1, 2, 2, 3}));
    EXPECT_EQ(c.r_inter.defined(), summaries);
  }
}

// With no clusters given, the one op chooses them (Top-K on its A_g) as the chain does from the
// reference steps' A_g: the same clusters, the same output.
TEST(CastAttentionFused, ChoosesTheClustersTheChainChooses) {
  const int64_t B = 2, H = 2, N = 40, C = 5, kappa = 9, d = 4;
  for (DType dt : {DType::f32, DType::f64}) {
    auto make = [&](const Shape& s, uint64_t seed) { return Tensor::uniform(s, seed, 0, -2.0, 2.0, dt); };
    const Tensor mask = tail_mask(N, {3, 11}, dt);
    ops::CastAttentionInputs in{Tensor::uniform({B, N, H}, 1, 0, 0.0, 1.0, dt),
                                make({B, H, N, d}, 2),
                                make({B, H, N, d}, 3),
                                make({B, H, N, d}, 4),
                                make({H, C, d}, 5),
                                mask,
                                Tensor(),
                                {},
                                kappa};
    Tensor by_op, by_chain;
    in.chosen = &by_op;
    const Tensor out_op = ops::run_step(/*fast=*/true, in);
    in.chosen = &by_chain;
    const Tensor out_chain = ops::run_step(/*fast=*/false, in);
    ASSERT_TRUE(by_op.defined() && by_chain.defined()) << dtype_name(dt);
    EXPECT_EQ(by_op.to_double_vector(), by_chain.to_double_vector()) << dtype_name(dt);
    expect_close_per_element(out_op, out_chain, dt == DType::f32 ? 3e-5 : 1e-10, dt == DType::f32 ? 3e-6 : 1e-12,
                             dtype_name(dt));
  }
}
