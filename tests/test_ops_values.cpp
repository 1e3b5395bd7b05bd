// Ops against hand-computed results, and the errors each kind of bad call produces.
#include <cmath>
#include <functional>
#include <memory>

#include "train/adamw.h"
#include "ops/layout.h"
#include "ops/loss.h"
#include "tensor/broadcast.h"
#include "tensor/permute_index.h"
#include "tensor/philox.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;

TEST(Values, MatmulTwoByTwo) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector<float>({5, 6, 7, 8}, {2, 2});
  expect_values(ops::matmul(a, b), {19, 22, 43, 50});
  expect_values(ops::matmul(a, b, true, false), {26, 30, 38, 44});
  expect_values(ops::matmul(a, b, false, true), {17, 23, 39, 53});
}

TEST(Values, MatmulLargeMatchesNaiveLoops) {
  // Exercises the blocked, parallel CPU path (sizes beyond one block) against three plain loops.
  const int64_t m = 70, k = 300, n = 530;
  Tensor a = constant({m, k}, 1), b = constant({k, n}, 2);
  Tensor c = ops::matmul(a, b);
  double worst = 0;
  for (int64_t i = 0; i < m; i += 7)
    for (int64_t j = 0; j < n; j += 13) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a.data<double>()[i * k + p] * b.data<double>()[p * n + j];
      worst = std::max(worst, std::abs(s - c.data<double>()[i * n + j]));
    }
  EXPECT_LT(worst, 1e-10);
}

TEST(Values, BroadcastAddAndDiv) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bias = Tensor::from_vector<float>({10, 20, 30}, {3});
  expect_values(ops::add(a, bias), {11, 22, 33, 14, 25, 36});
  Tensor col = Tensor::from_vector<float>({1, 2}, {2, 1});
  expect_values(ops::div(a, col), {1, 2, 3, 2, 2.5, 3});
}

TEST(Values, SumMean) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(ops::sum(a, 0), {5, 7, 9});
  expect_values(ops::mean(a, 1), {2, 5});
  expect_values(ops::sum_all(a), {21});
}

TEST(Values, UnaryFunctions) {
  Tensor x = Tensor::from_vector<double>({-1.0, 0.0, 1.0}, {3});
  expect_values(ops::relu(x), {0, 0, 1});
  expect_values(ops::sigmoid(x), {1 / (1 + std::exp(1.0)), 0.5, 1 / (1 + std::exp(-1.0))}, 1e-12);
  expect_values(ops::gelu(x), {-0.15865525393145707, 0.0, 0.8413447460685429}, 1e-12);
  // Laplace function: 1/2 at μ = √½, and Φ(1) one σ above it.
  Tensor l = Tensor::from_vector<double>({kLaplaceMu, kLaplaceMu + kLaplaceSigma}, {2});
  expect_values(ops::laplace(l), {0.5, 0.8413447460685429}, 1e-12);
}

TEST(Values, SoftmaxWithMask) {
  Tensor x = Tensor::from_vector<double>({0, std::log(3.0), 5}, {1, 3});
  Tensor mask = Tensor::from_vector<double>({1, 1, 0}, {1, 3});
  expect_values(ops::softmax(x, mask), {0.25, 0.75, 0}, 1e-12);
  expect_values(ops::log_softmax(x, mask), {std::log(0.25), std::log(0.75), 0}, 1e-12);
}

TEST(Values, LayerNorm) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4}, {1, 4});
  Tensor g = Tensor::from_vector<double>({1, 1, 2, 2}, {4});
  Tensor b = Tensor::from_vector<double>({0, 0, 0, 1}, {4});
  const double s = 1 / std::sqrt(1.25 + 1e-5);
  expect_values(ops::layernorm(x, g, b), {-1.5 * s, -0.5 * s, 1.0 * s, 3.0 * s + 1}, 1e-12);
}

TEST(Values, CrossEntropyIgnoresNegativeLabels) {
  Tensor logits = Tensor::from_vector<double>({0, 0, 0, 0, 5, 0}, {2, 3});
  Tensor labels = Tensor::from_vector<int32_t>({1, -1}, {2});
  expect_values(ops::cross_entropy(logits, labels), {std::log(3.0)}, 1e-12);
}

TEST(Values, EmbeddingGatherScatter) {
  Tensor table = Tensor::from_vector<float>({0, 1, 10, 11, 20, 21}, {3, 2});
  Tensor idx = Tensor::from_vector<int32_t>({2, 0, 2}, {3});
  expect_values(ops::embedding(table, idx), {20, 21, 0, 1, 20, 21});
  Tensor rows = Tensor::from_vector<int32_t>({1, -1}, {1, 2});
  expect_values(ops::gather_rows(table.view({1, 3, 2}), rows), {10, 11, 0, 0});
  Tensor src = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {1, 3, 2});
  Tensor to = Tensor::from_vector<int32_t>({0, 0, 2}, {1, 3});
  expect_values(ops::scatter_add_rows(src, to, 3), {4, 6, 0, 0, 5, 6});
}

TEST(Values, MaskedMeanExcludesPadding) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 100}, {1, 4, 1});
  Tensor mask = Tensor::from_vector<float>({1, 1, 1, 0}, {1, 4});
  expect_values(ops::masked_mean(x, mask), {2});
  Tensor none = Tensor::zeros({1, 4});
  expect_values(ops::masked_mean(x, none), {0});
}

TEST(Values, TopkOrderTiesAndMask) {
  Tensor x = Tensor::from_vector<float>({1, 5, 3, 5, 2, 9, 0, 0}, {2, 4});
  expect_values(ops::topk(x, 3), {1, 3, 2, 1, 0, 2});
  Tensor mask = Tensor::from_vector<float>({1, 0, 1, 1, 0, 1, 0, 0}, {2, 4});
  expect_values(ops::topk(x, 3, mask), {3, 2, 0, 1, -1, -1});
}

TEST(Values, DropoutKeepsExpectedFractionAndScales) {
  Tensor x = Tensor::full({10000}, 1.0);
  Tensor y = ops::dropout(x, 0.25, 5, 0);
  double kept = 0, total = 0;
  for (double v : y.to_double_vector()) {
    kept += v != 0;
    total += v;
    if (v != 0) EXPECT_NEAR(v, 1 / 0.75, 1e-6);
  }
  EXPECT_NEAR(kept / 10000, 0.75, 0.02);
  EXPECT_NEAR(total / 10000, 1.0, 0.03);
}

TEST(Values, SplitConcatRoundTrip) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto parts = ops::split(x, {1, 2}, 1);
  expect_values(parts[0], {1, 4});
  expect_values(parts[1], {2, 3, 5, 6});
  expect_values(ops::concat({parts[1], parts[0]}, 1), {2, 3, 1, 5, 6, 4});
  expect_values(ops::transpose(x, 0, 1), {1, 4, 2, 5, 3, 6});
}

// ---------------------------------------------------------------- RNG
TEST(Rng, CounterBasedStreamIsReproducible) {
  Tensor a = Tensor::uniform({100}, 42, 1000), b = Tensor::uniform({100}, 42, 1000);
  EXPECT_EQ(max_abs_diff(a, b), 0.0);
  Tensor c = Tensor::uniform({50}, 42, 1050);  // an offset continues the same stream
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.data<float>()[50 + i], c.data<float>()[i]);
  Tensor d = Tensor::uniform({100}, 43, 1000);
  EXPECT_GT(max_abs_diff(a, d), 0.1);
}

TEST(Rng, NormalMoments) {
  auto v = Tensor::normal({20000}, 7, 0, 1.0, DType::f64).to_double_vector();
  double m = 0, s = 0;
  for (double x : v) m += x;
  m /= v.size();
  for (double x : v) s += (x - m) * (x - m);
  EXPECT_NEAR(m, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(s / v.size()), 1.0, 0.03);
}

TEST(Rng, PhiloxKnownAnswer) {
  // Philox-4x32-10 with counter 0 and key 0 (the published known-answer vector).
  philox::Block b = philox::generate(0, 0);
  EXPECT_EQ(b.v[0], 0x6627e8d5u);
  EXPECT_EQ(b.v[1], 0xe169c58du);
  EXPECT_EQ(b.v[2], 0xbc57ac4cu);
  EXPECT_EQ(b.v[3], 0x9b00dbd8u);
}

TEST(Rng, FirstWordsAreGeneratesFirstWordAcrossTheCounterCarry) {
  // counters from 2^32 − 40 to 2^32 + 60: the low word wraps and the carry reaches the high one
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, (uint64_t{3} << 32) + 11}) {
    const uint64_t start = (uint64_t{1} << 32) - 40;
    uint32_t words[100];
    philox::first_words(seed, start, 100, words);
    for (int j = 0; j < 100; ++j)
      ASSERT_EQ(words[j], philox::generate(seed, start + j).v[0]) << "seed " << seed << " j " << j;
  }
}

TEST(Rng, UnitThresholdIsUniformAgainstP) {
  for (double p : {0.0, 0.1, 0.25, 1.0 / 3.0, 0.5, 0.999})
    for (uint32_t w : {0u, 255u, 256u, 0x19999900u, 0x1999999Au, 0x40000000u, 0x55555555u, 0x55555600u, 0xFFFFFFFFu})
      EXPECT_EQ(philox::unit_at_least(w, philox::unit_threshold(p)), philox::to_unit(w) >= p)
          << "p " << p << " w " << w;
}

TEST(Values, DropoutMaskIsTheCounterRuleForwardAndBackward) {
  // element i is kept iff philox::uniform(seed, offset + i) >= p, the CUDA kernel's rule; 3000
  // elements cross several chunks and the 2^32 counter carry
  const double p = 0.3;
  const uint64_t seed = 21, offset = (uint64_t{1} << 32) - 1234;
  for (DType dtype : {DType::f32, DType::f64}) {
    Tensor x = Tensor::uniform({3000}, 4, 0, 0.5, 1.5, dtype);
    Tensor y = Tensor::full({3000}, std::nan(""), dtype);  // poisoned: forward writes every element
    ops::dropout_forward(y, x, p, seed, offset);
    Tensor dx = Tensor::full({3000}, 2.0, dtype);  // backward accumulates into it
    ops::dropout_backward(dx, x, p, seed, offset);
    const auto xv = x.to_double_vector(), yv = y.to_double_vector(), dv = dx.to_double_vector();
    for (int i = 0; i < 3000; ++i) {
      const double want = philox::uniform(seed, offset + i) >= p ? xv[i] / (1 - p) : 0.0;
      ASSERT_NEAR(yv[i], want, 1e-6 * std::abs(want)) << "element " << i;
      ASSERT_NEAR(dv[i], 2.0 + want, 1e-6 * (2.0 + std::abs(want))) << "element " << i;
    }
  }
}

// ---------------------------------------------------------------- autograd mechanics
TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = param({3}, 1);
  autograd::clear_tape();
  {
    autograd::NoGradGuard guard;
    Tensor y = ops::exp(x);
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(autograd::tape_size(), 0u);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = param({2}, 2);
  autograd::backward(ops::sum_all(ops::scale(x, 3.0)));
  autograd::backward(ops::sum_all(ops::scale(x, 3.0)));
  expect_values(x.grad(), {6, 6});
  x.zero_grad();
  expect_values(x.grad(), {0, 0});
}

TEST(Autograd, DeepChainDoesNotRecurse) {
  Tensor x = param({4}, 3);
  Tensor h = x;
  for (int i = 0; i < 100000; ++i) h = ops::affine(h, 1.0, 0.0);
  autograd::backward(ops::sum_all(h));
  expect_values(x.grad(), {1, 1, 1, 1});
}

TEST(Autograd, ShapeCheckedAccumulation) {
  Tensor x = param({2, 3}, 4);
  EXPECT_CAST_ERROR(autograd::accumulate(x, Tensor::zeros({3, 2}, DType::f64)), "does not match");
}

// A reshape's backward hands its output's gradient buffer to the input instead of copying it,
// but only a buffer that backward() releases: the root's gradient stays the caller's own, and
// a later gradient added into the input never shows in it.
TEST(Autograd, ReshapeTakesOverOnlyAReleasedGradient) {
  Tensor x = param({2, 3}, 5);
  Tensor y = ops::reshape(x, {3, 2});
  const Tensor dy = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {3, 2});
  autograd::backward(y, dy);
  expect_values(x.grad(), {1, 2, 3, 4, 5, 6});
  EXPECT_NE(x.grad().raw_data(), y.grad().raw_data());
  autograd::backward(ops::sum_all(ops::scale(x, 1.0)));  // adds 1 into x's gradient
  expect_values(y.grad(), {1, 2, 3, 4, 5, 6});
  // inside a graph, with x reaching the loss twice: the reshaped path's buffer becomes x's
  // gradient, and the other path adds into it
  Tensor z = param({2, 3}, 6);
  autograd::backward(
      ops::sum_all(ops::add(ops::scale(ops::reshape(z, {6}), 2.0), ops::reshape(ops::scale(z, 3.0), {6}))));
  expect_values(z.grad(), {5, 5, 5, 5, 5, 5});
}

namespace {
// y = 2x, recorded by hand, whose backward first runs `check` on itself.
struct ProbeNode final : autograd::Node {
  Tensor x;
  bool reads_outputs = true;
  std::function<void(const ProbeNode&)> check;
  const char* name() const override { return "probe"; }
  bool backward_reads_outputs() const override { return reads_outputs; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    check(*this);
    autograd::accumulate(x, ops::scale(outputs[0].grad(), 2.0));
  }
};
Tensor probe(const Tensor& x, bool reads_outputs, std::function<void(const ProbeNode&)> check) {
  Tensor y;
  {
    autograd::NoGradGuard made_by_hand;
    y = ops::scale(x, 2.0);
  }
  auto node = std::make_unique<ProbeNode>();
  node->x = x, node->reads_outputs = reads_outputs, node->check = std::move(check);
  node->outputs = {y};
  autograd::record(std::move(node));
  return y;
}
}  // namespace

// backward() frees each node, with what it saved, once its backward has run, and releases the
// values of an output that only its node holds when that node's backward does not read them.
TEST(Autograd, BackwardFreesWhatNoLaterNodeReads) {
  Tensor x = param({3}, 7);
  std::weak_ptr<TensorImpl> later_output;
  int ran = 0;
  Tensor kept = probe(x, false, [&](const ProbeNode& node) {
    ++ran;
    EXPECT_TRUE(later_output.expired()) << "the later node and the output only it held are gone";
    EXPECT_NE(node.outputs[0].impl()->storage, nullptr) << "the caller holds this output: its values stay";
  });
  Tensor dropped = probe(kept, false, [&](const ProbeNode& node) {
    ++ran;
    EXPECT_EQ(node.outputs[0].impl()->storage, nullptr) << "only this node held its output, and reads no value";
  });
  Tensor read = probe(kept, true, [&](const ProbeNode& node) {
    ++ran;
    EXPECT_NE(node.outputs[0].impl()->storage, nullptr) << "this backward declares that it reads its output";
  });
  later_output = dropped.impl_ptr();
  Tensor loss = ops::add(ops::sum_all(dropped), ops::sum_all(read));
  dropped = Tensor(), read = Tensor();
  autograd::backward(loss);
  EXPECT_EQ(ran, 3);
  expect_values(x.grad(), {8, 8, 8});  // loss = Σ 2·kept + Σ 2·kept, kept = 2x
  const std::vector<double> xs = x.to_double_vector(), ks = kept.to_double_vector();
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_EQ(ks[i], 2 * xs[i]);
  EXPECT_CAST_ERROR(
      [] {
        Tensor t = Tensor::zeros({2});
        t.impl()->storage.reset();
        return t.raw_data();
      }(),
      "were released");
}

// ---------------------------------------------------------------- bad calls
TEST(Errors, ShapeMismatchNamesTheOp) {
  EXPECT_CAST_ERROR(ops::matmul(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})), "matmul");
  EXPECT_CAST_ERROR(ops::add(Tensor::zeros({2, 3}), Tensor::zeros({4})), "add");
  EXPECT_CAST_ERROR(ops::layernorm(Tensor::zeros({2, 3}), Tensor::zeros({4}), Tensor::zeros({4})), "layernorm");
  EXPECT_CAST_ERROR(ops::concat({Tensor::zeros({2, 3}), Tensor::zeros({3, 3})}, 1), "concat");
  EXPECT_CAST_ERROR(ops::split(Tensor::zeros({2, 3}), {1, 1}, 1), "split");
  EXPECT_CAST_ERROR(ops::cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({3}, DType::i32)), "cross_entropy");
  EXPECT_CAST_ERROR(ops::softmax(Tensor::zeros({4, 3}), Tensor::zeros({3, 3})), "softmax");
  EXPECT_CAST_ERROR(ops::reshape(Tensor::zeros({2, 3}), {4, 2}), "view");
  EXPECT_CAST_ERROR(ops::permute(Tensor::zeros({2, 3}), {0, 0}), "permute");
}

TEST(Errors, WrongDtypeNamesTheOp) {
  Tensor ints = Tensor::zeros({3}, DType::i32);
  EXPECT_CAST_ERROR(ops::exp(ints), "exp");
  EXPECT_CAST_ERROR(ops::matmul(Tensor::zeros({2, 2}), Tensor::zeros({2, 2}, DType::f64)), "matmul");
  EXPECT_CAST_ERROR(ops::embedding(Tensor::zeros({3, 2}), Tensor::zeros({2})), "embedding");
  EXPECT_CAST_ERROR(ops::cross_entropy(Tensor::zeros({2, 3}), Tensor::zeros({2})), "cross_entropy");
  EXPECT_CAST_ERROR(Tensor::zeros({2}).set_requires_grad(true).data<double>(), "data<f64>");
}

TEST(Errors, IndexOutOfRange) {
  EXPECT_CAST_ERROR(ops::embedding(Tensor::zeros({3, 2}), Tensor::from_vector<int32_t>({0, 3}, {2})), "out of range");
  EXPECT_CAST_ERROR(ops::gather_rows(Tensor::zeros({1, 3, 2}), Tensor::from_vector<int32_t>({-2}, {1, 1})),
                    "out of range");
  EXPECT_CAST_ERROR(ops::cross_entropy(Tensor::zeros({1, 3}), Tensor::from_vector<int32_t>({3}, {1})), "out of range");
}

TEST(Errors, WrongDeviceNamesTheOp) {
  SKIP_WITHOUT_GPU();
  Tensor gpu = Tensor::zeros({2, 2}, DType::f32, Device::cuda);
  EXPECT_CAST_ERROR(ops::add(Tensor::zeros({2, 2}), gpu), "different devices");
  EXPECT_CAST_ERROR(ops::matmul(Tensor::zeros({2, 2}), gpu), "different devices");
  EXPECT_CAST_ERROR(Tensor::zeros({2}, DType::f64, Device::cuda), "f64");
}

TEST(Errors, CudaWithoutGpuIsAClearError) {
  if (device_memory::cuda_available()) GTEST_SKIP() << "a GPU is present: the no-GPU error cannot occur";
  EXPECT_THROW(Tensor::zeros({2}, DType::f32, Device::cuda), Error);
}

TEST(Values, AdamWFirstStepMovesByTheLearningRate) {
  // at t = 1 the bias-corrected step is g/|g| per element: each parameter moves by lr (+ decay)
  Tensor p = Tensor::from_vector<double>({1.0, -2.0}, {2});
  Tensor g = Tensor::from_vector<double>({0.5, -0.25}, {2});
  Tensor m = Tensor::zeros({2}, DType::f64), v = Tensor::zeros({2}, DType::f64);
  train::adamw_update(p, g, m, v, train::AdamWStep{0.1, 0.9, 0.98, 1e-12, 0.5, 1});
  expect_values(p, {1.0 - 0.1 * (1.0 + 0.5 * 1.0), -2.0 - 0.1 * (-1.0 + 0.5 * -2.0)}, 1e-9);
  expect_values(m, {0.05, -0.025}, 1e-12);
  expect_values(v, {0.02 * 0.25, 0.02 * 0.0625}, 1e-12);
}

TEST(Values, CorrectPredictionsAndClipFactor) {
  // row 0: 3 twice, the first (1) counts; row 1: tie at 0; row 2: NaN ranks last, 5 wins; row 3:
  // all equal, class 0 wins, label 2 misses
  Tensor logits = Tensor::from_vector<double>({1, 3, 3, 0, 2, 2, 1, 1, NAN, 0, -1, 5, 0, 0, 0, 0}, {4, 4});
  expect_values(ops::correct_predictions(logits, Tensor::from_vector<int32_t>({1, 0, 3, 2}, {4})), {3});
  expect_values(ops::correct_predictions(logits, Tensor::from_vector<int32_t>({2, 1, 0, -1}, {4})), {0});
  expect_values(train::clip_factor(Tensor::full({1}, 16.0, DType::f64), 2.0), {0.5});
  expect_values(train::clip_factor(Tensor::full({1}, 1.0, DType::f64), 2.0), {1});
  expect_values(train::clip_factor(Tensor::full({1}, 16.0, DType::f64), 0.0), {1});  // clipping off
  expect_values(train::clip_factor(Tensor::full({1}, NAN, DType::f64), 2.0), {1});
}

// The GPU kernels use index maps with merged dimensions: every element must map to the same
// offsets as through the full map, in 64-bit and in 32-bit index math.
TEST(Values, CoalescedIndexMapsAgree) {
  const std::vector<std::pair<Shape, Shape>> pairs{
      {{2, 3, 4, 5}, {2, 3, 4, 5}}, {{2, 3, 4, 5}, {5}}, {{2, 1, 4, 1}, {1, 3, 1, 5}},
      {{7, 1, 3}, {1, 1, 1}},       {{1}, {1}},          {{2, 3, 1, 5}, {3, 1, 1}},
      {{4, 1, 6}, {4, 2, 6}}};
  for (const auto& [sa, sb] : pairs) {
    const Shape out = broadcast_shapes("test", sa, sb);
    const BroadcastIndex full = make_broadcast_index(out, sa, sb), merged = coalesce(full);
    EXPECT_LE(merged.ndim, full.ndim);
    for (int64_t i = 0; i < shape_numel(out); ++i) {
      int64_t a0, b0, a1, b1;
      int32_t a2, b2;
      full.offsets(i, a0, b0);
      merged.offsets(i, a1, b1);
      merged.offsets<int32_t>(static_cast<int32_t>(i), a2, b2);
      ASSERT_TRUE(a0 == a1 && b0 == b1 && a0 == a2 && b0 == b2)
          << shape_str(sa) << " with " << shape_str(sb) << ", element " << i;
    }
  }
  EXPECT_EQ(coalesce(make_broadcast_index({2, 3, 4}, {2, 3, 4}, {2, 3, 4})).ndim, 1);  // same shape: one dimension
  EXPECT_EQ(coalesce(make_broadcast_index({2, 3, 4}, {2, 3, 4}, {4})).ndim, 2);        // bias add: two
  for (const auto& perm : std::vector<std::vector<int>>{{0, 2, 1, 3}, {3, 2, 1, 0}, {0, 1, 2, 3}, {1, 0, 2, 3}}) {
    const PermuteIndex full = ops::make_permute_index({2, 3, 1, 5}, perm), merged = full.coalesced();
    for (int64_t i = 0; i < 30; ++i) {
      ASSERT_EQ(full.input_offset(i), merged.input_offset(i)) << "element " << i;
      ASSERT_EQ(full.input_offset(i), merged.input_offset<int32_t>(static_cast<int32_t>(i))) << "element " << i;
    }
  }
  EXPECT_EQ(ops::make_permute_index({2, 3, 1, 5}, {0, 1, 2, 3}).coalesced().ndim, 1);  // identity: a copy
}

TEST(Values, Narrow0IsARowRangeViewAndFullFillsOnItsDevice) {
  Tensor t = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor rows = t.narrow0(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 2}));
  expect_values(rows, {2, 3, 4, 5});
  rows.data<int32_t>()[0] = 9;  // a view: the write lands in t
  EXPECT_EQ(t.data<int32_t>()[2], 9);
  EXPECT_EQ(t.narrow0(4, 0).numel(), 0);
  EXPECT_CAST_ERROR(t.narrow0(3, 2), "narrow0: rows [3, 5) outside");
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64})
    expect_values(Tensor::full({3}, -2.0, dt), {-2, -2, -2});
}
