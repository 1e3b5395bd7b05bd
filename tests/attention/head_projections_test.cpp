// The layer's projections with the heads split or merged, one node each: finite differences and
// agreement with the product and permute.
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

// CUDA reads and writes the heads in place (one strided product per head, a weight's gradient
// through per-batch terms); the CPU through token-major rows. Both against each other on the same
// inputs, with odd sizes, every input's gradient prefilled.
TEST(CudaVsCpuHeadProjections, HeadsInPlaceAgreeWithTheCpu) {
  SKIP_WITHOUT_GPU();
  // in place (the engine's), and permuted as on the CPU (cast bench --head-projections permuted)
  for (ops::HeadProjections way : {ops::HeadProjections::in_place, ops::HeadProjections::permuted})
    for (auto [B, N, D, H, d] :
         std::vector<std::array<int64_t, 5>>{{1, 1, 1, 1, 1}, {2, 7, 12, 3, 4}, {3, 33, 16, 2, 9}, {2, 5, 6, 4, 64}}) {
      ops::set_cuda_head_projections(way);
      SCOPED_TRACE(fmt::format("B{} N{} D{} H{} d{} {}", B, N, D, H, d,
                               way == ops::HeadProjections::in_place ? "in place" : "permuted"));
      expect_devices_agree([H](const Inputs& x) { return ops::project_heads(x[0], x[1], H); },
                           Inputs{Tensor::uniform({B, N, D}, 31, 0, -1.0, 1.0).set_requires_grad(),
                                  Tensor::uniform({D, H * d}, 32, 0, -1.0, 1.0).set_requires_grad()});
      expect_devices_agree([](const Inputs& x) { return ops::merge_heads_project(x[0], x[1]); },
                           Inputs{Tensor::uniform({B, H, N, d}, 33, 0, -1.0, 1.0).set_requires_grad(),
                                  Tensor::uniform({H * d, D}, 34, 0, -1.0, 1.0).set_requires_grad()});
    }
  ops::set_cuda_head_projections(ops::HeadProjections::in_place);
}

// No tokens on CUDA: each weight's first gradient is zeros (a sum of no products), as on the CPU.
TEST(CudaVsCpuHeadProjections, NoTokensGiveZeroWeightGradients) {
  SKIP_WITHOUT_GPU();
  for (ops::HeadProjections way : {ops::HeadProjections::in_place, ops::HeadProjections::permuted}) {
    ops::set_cuda_head_projections(way);
    Tensor x = Tensor::zeros({2, 0, 3}).to(Device::cuda).set_requires_grad();
    Tensor w = Tensor::uniform({3, 4}, 5, 0, -1.0, 1.0, DType::f32).to(Device::cuda).set_requires_grad();
    Tensor wo = Tensor::uniform({4, 3}, 6, 0, -1.0, 1.0, DType::f32).to(Device::cuda).set_requires_grad();
    Tensor out = ops::merge_heads_project(ops::project_heads(x, w, 2), wo);
    autograd::backward(out, Tensor::zeros(out.shape()).to(Device::cuda));
    for (const Tensor* t : {&w, &wo})
      for (double v : t->grad().to(Device::cpu).to_double_vector()) EXPECT_EQ(v, 0.0);
  }
  ops::set_cuda_head_projections(ops::HeadProjections::in_place);
}

// First gradients on CUDA (no gradient before, buffers poisoned): each is written whole, a
// weight's from all of its per-batch terms, not added to what its buffer held.
TEST(CudaVsCpuHeadProjections, FirstGradientsAreWrittenWhole) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> grads[2];
  for (int r = 0; r < 2; ++r) {
    const Device device = r == 0 ? Device::cpu : Device::cuda;
    Tensor x = Tensor::uniform({3, 4, 5}, 41, 0, -1.0, 1.0).to(device).set_requires_grad();
    Tensor w = Tensor::uniform({5, 6}, 42, 0, -1.0, 1.0).to(device).set_requires_grad();
    Tensor wo = Tensor::uniform({6, 7}, 43, 0, -1.0, 1.0).to(device).set_requires_grad();
    Tensor out = ops::merge_heads_project(ops::project_heads(x, w, 2), wo);
    autograd::backward(out, Tensor::uniform(out.shape(), 44, 0, -1.0, 1.0).to(device));
    for (const Tensor* t : {&x, &w, &wo}) grads[r].push_back(t->grad().to(Device::cpu));
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    expect_close_per_element(grads[1][i], grads[0][i], 1e-5, 1e-6, fmt::format("first gradient of input {}", i));
}
