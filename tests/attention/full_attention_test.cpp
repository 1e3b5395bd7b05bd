// Full attention (ATTENTION.md §1) and its flash twin: finite differences, the CPU kernel against
// the reference on partial and several tiles and key splits, and the CUDA kernels against the CPU.
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

// ---------------------------------------------------------------- steps
TEST(AttentionStepGrad, FullAttentionWithMask) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 1, 0, 1, 1, 0, 0}, {2, 4});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::full_attention(x[0], x[1], x[2], mask); },
                   (Inputs{param({2, 2, 4, 3}, 1), param({2, 2, 4, 3}, 2), param({2, 2, 4, 3}, 3)}));
}

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
          EXPECT_EQ(device[t], reference[t])
              << names[t] << ": NaN in " << (which == 1 ? "k" : "v") << " of a " << (on_padding ? "padding" : "real")
              << " key, at " << precision_name(precision);
        // the forward never looks at a padding key's scores
        if (which == 1)
          EXPECT_EQ(std::find(reference[0].begin(), reference[0].end(), true) != reference[0].end(), !on_padding);
      }
}
