// Layer 2: every op on CUDA against the CPU reference, forward and backward.
// Skipped, with the reason, where no GPU is present.
#include "train/adamw.h"
#include "ops/rows.h"
#include "tensor/philox.h"
#include "tests/device_compare.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

TEST(CudaVsCpu, BinaryBroadcast) {
  SKIP_WITHOUT_GPU();
  for (auto [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{33, 65}, {65}}, {{2, 1, 7}, {5, 1}}, {{1000}, {1000}}})
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div})
      expect_devices_agree(
          [op](const Inputs& x) {
            switch (op) {
              case BinaryOp::add: return ops::add(x[0], x[1]);
              case BinaryOp::sub: return ops::sub(x[0], x[1]);
              case BinaryOp::mul: return ops::mul(x[0], x[1]);
              default: return ops::div(x[0], x[1]);
            }
          },
          Inputs{rand32(sa, 1), rand32(sb, 2, 0.5, 2.0)});
}

TEST(CudaVsCpu, AffineAndReductions) {
  SKIP_WITHOUT_GPU();
  Inputs in = {rand32({17, 33, 9}, 3)};
  expect_devices_agree([](const Inputs& x) { return ops::affine(x[0], 0.5, -1.0); }, in);
  for (int axis : {0, 1, 2}) expect_devices_agree([axis](const Inputs& x) { return ops::mean(x[0], axis); }, in);
  expect_devices_agree([](const Inputs& x) { return ops::sum_all(x[0]); }, in);
  // a few long rows (a parameter's squared norm): summed in chunks of 16384 across blocks, then
  // each row's chunk sums in order
  const Inputs long_rows = {rand32({3, 70001}, 25)};
  expect_devices_agree([](const Inputs& x) { return ops::sum(x[0], 1); }, long_rows, 1e-4);
  expect_devices_agree([](const Inputs& x) { return ops::sum_all(x[0]); }, long_rows, 1e-4);
}

TEST(CudaVsCpu, UnaryFunctions) {
  SKIP_WITHOUT_GPU();
  for (UnaryOp op :
       {UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::relu, UnaryOp::gelu, UnaryOp::sigmoid, UnaryOp::laplace}) {
    const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt;
    expect_devices_agree([op](const Inputs& x) { return ops::unary(op, x[0]); },
                         Inputs{rand32({257, 3}, 4, positive ? 0.1 : -2.0, 2.0)});
  }
}

TEST(CudaVsCpu, Matmul) {
  SKIP_WITHOUT_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape sa = ta ? Shape{3, 70, 33} : Shape{3, 33, 70};
      Shape sb = tb ? Shape{3, 45, 70} : Shape{3, 70, 45};
      expect_devices_agree([ta, tb](const Inputs& x) { return ops::matmul(x[0], x[1], ta, tb); },
                           Inputs{rand32(sa, 5), rand32(sb, 6)});
    }
  expect_devices_agree([](const Inputs& x) { return ops::matmul(x[0], x[1]); },
                       Inputs{rand32({2, 5, 64}, 7), rand32({64, 31}, 8)});
}

TEST(CudaVsCpu, Linear) {
  SKIP_WITHOUT_GPU();
  expect_devices_agree([](const Inputs& x) { return ops::linear(x[0], x[1], x[2]); },
                       Inputs{rand32({2, 5, 64}, 9), rand32({64, 31}, 10), rand32({31}, 11)});
  expect_devices_agree([](const Inputs& x) { return ops::linear(x[0], x[1], x[2]); },
                       Inputs{rand32({7, 3}, 12), rand32({3, 9}, 13), rand32({9}, 14)});
}

TEST(CudaVsCpu, SoftmaxLayerNorm) {
  SKIP_WITHOUT_GPU();
  Tensor mask = Tensor::uniform({2, 300}, 9, 0).to(DType::f32);
  {
    auto v = mask.to_double_vector();
    std::vector<float> m(v.size());
    for (size_t i = 0; i < v.size(); ++i) m[i] = v[i] > 0.3 ? 1.f : 0.f;
    mask = Tensor::from_vector<float>(m, {2, 300});
  }
  Tensor gmask = mask.to(Device::cuda);
  Inputs in = {rand32({2, 3, 5, 300}, 10, -3, 3)};
  expect_devices_agree([&](const Inputs& x) { return ops::softmax(x[0], x[0].is_cuda() ? gmask : mask); }, in);
  expect_devices_agree([&](const Inputs& x) { return ops::log_softmax(x[0], x[0].is_cuda() ? gmask : mask); }, in);
  expect_devices_agree([](const Inputs& x) { return ops::softmax(x[0]); }, Inputs{rand32({7, 1025}, 11, -3, 3)});
  // short rows, one warp each: 111 rows (a partial block of 8), lengths on both sides of 128,
  // a grouped mask (37 rows to each mask row) with a fully masked row
  for (int64_t len : {5, 50, 128, 129}) {
    std::vector<float> m(3 * len, 1.f);
    for (int64_t j = len / 2; j < len; ++j) m[j] = 0.f;
    for (int64_t j = 0; j < len; ++j) m[2 * len + j] = 0.f;
    const Tensor short_mask = Tensor::from_vector<float>(m, {3, len}), short_gmask = short_mask.to(Device::cuda);
    expect_devices_agree([&](const Inputs& x) { return ops::softmax(x[0], x[0].is_cuda() ? short_gmask : short_mask); },
                         Inputs{rand32({3 * 37, len}, 19 + len, -3, 3)});
    expect_devices_agree(
        [&](const Inputs& x) { return ops::log_softmax(x[0], x[0].is_cuda() ? short_gmask : short_mask); },
        Inputs{rand32({3 * 37, len}, 20 + len, -3, 3)});
  }
  expect_devices_agree([](const Inputs& x) { return ops::layernorm(x[0], x[1], x[2]); },
                       Inputs{rand32({37, 129}, 12), rand32({129}, 13), rand32({129}, 14)});
  // many rows: the parameter gradients' two-stage reduction over 16 chunks, the last one short,
  // and a partial tile of columns
  expect_devices_agree([](const Inputs& x) { return ops::layernorm(x[0], x[1], x[2]); },
                       Inputs{rand32({1000, 40}, 15), rand32({40}, 16), rand32({40}, 17)});
}

TEST(CudaVsCpu, LayoutOps) {
  SKIP_WITHOUT_GPU();
  Inputs in = {rand32({3, 4, 5, 6}, 15)};
  expect_devices_agree([](const Inputs& x) { return ops::permute(x[0], {0, 2, 1, 3}); }, in);
  // rows of 8 floats: the heads' split and merge move them four at a time; a permute that moves
  // the last axis, or of rows of 6 floats, goes element by element
  const Inputs rows8 = {rand32({3, 4, 5, 8}, 21)};
  expect_devices_agree([](const Inputs& x) { return ops::permute(x[0], {0, 2, 1, 3}); }, rows8);
  expect_devices_agree([](const Inputs& x) { return ops::permute(x[0], {0, 1, 3, 2}); }, rows8);
  expect_devices_agree([](const Inputs& x) { return ops::permute(ops::add(x[0], x[0]), {2, 1, 0, 3}); }, rows8);
  expect_devices_agree([](const Inputs& x) { return ops::permute(x[0], {1, 0, 2}); }, Inputs{rand32({3, 5, 6}, 22)});
  expect_devices_agree([](const Inputs& x) { return ops::transpose(x[0], 1, 3); }, in);
  expect_devices_agree(
      [](const Inputs& x) {
        return ops::concat({x[0], x[1]}, 2);
      },
      Inputs{in[0], rand32({3, 4, 2, 6}, 16)});
  expect_devices_agree(
      [](const Inputs& x) {
        auto p = ops::split(x[0], {2, 3}, 2);
        return ops::mul(p[0], ops::sum(p[1], 2, true));
      },
      in);
}

TEST(CudaVsCpu, RowsEmbeddingPooling) {
  SKIP_WITHOUT_GPU();
  Tensor idx = Tensor::from_vector<int32_t>({4, 0, -1, 4, 2, 1, 3, -1, 0, 0, 4, 4}, {2, 6});
  auto on = [&](const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; };
  expect_devices_agree([&](const Inputs& x) { return ops::gather_rows(x[0], on(idx, x[0])); },
                       Inputs{rand32({2, 5, 33}, 17)});
  // rows of 32 floats: the gather moves them four at a time (rows of 33 go element by element)
  expect_devices_agree([&](const Inputs& x) { return ops::gather_rows(x[0], on(idx, x[0])); },
                       Inputs{rand32({2, 5, 32}, 23)});
  expect_devices_agree([&](const Inputs& x) { return ops::scatter_add_rows(x[0], on(idx, x[0]), 5); },
                       Inputs{rand32({2, 6, 33}, 18)});
  Tensor tok = Tensor::from_vector<int64_t>({3, 0, 3, 1, 9, 9, 2}, {7});
  expect_devices_agree([&](const Inputs& x) { return ops::embedding(x[0], on(tok, x[0])); },
                       Inputs{rand32({10, 16}, 19)});
  Tensor mask = Tensor::from_vector<float>({1, 1, 0, 1, 0, 0, 0, 0, 0, 0}, {2, 5});
  expect_devices_agree([&](const Inputs& x) { return ops::masked_mean(x[0], on(mask, x[0])); },
                       Inputs{rand32({2, 5, 33}, 20)});
}

TEST(CudaVsCpu, LossDropoutTopk) {
  SKIP_WITHOUT_GPU();
  auto on = [&](const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; };
  Tensor labels = Tensor::from_vector<int32_t>({2, 0, -1, 9, 5}, {5});
  expect_devices_agree([&](const Inputs& x) { return ops::cross_entropy(x[0], on(labels, x[0])); },
                       Inputs{rand32({5, 10}, 21, -3, 3)});
  expect_devices_agree([](const Inputs& x) { return ops::dropout(x[0], 0.4, 1234, 99); }, Inputs{rand32({3001}, 22)});
  expect_devices_agree([](const Inputs& x) { return ops::dropout_add(x[0], x[1], 0.4, 1234, 99); },
                       Inputs{rand32({3001}, 24), rand32({3001}, 25)});
  Tensor mask = Tensor::from_vector<float>({1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1}, {2, 6});
  expect_devices_agree([&](const Inputs& x) { return ops::topk(x[0], 4, on(mask, x[0])); },
                       Inputs{rand32({2, 3, 6}, 23, -1, 1, false)});
  // ties: many equal values must come out in ascending index order on both devices
  Tensor ties = Tensor::from_vector<float>({1, 2, 2, 1, 2, 0, 2, 1}, {1, 8});
  expect_devices_agree([](const Inputs& x) { return ops::topk(x[0], 6); }, Inputs{ties});
  // the trainer's statistics on the device: correct predictions (ties, NaN, a label nobody
  // predicts) and clipping's factor (above, below and at the limit, NaN)
  Tensor logits =
      Tensor::from_vector<float>({1, 3, 3, 0, /**/ 2, 2, 1, 1, /**/ NAN, 0, -1, 5, /**/ 0, 0, 0, 0}, {4, 4});
  Tensor answers = Tensor::from_vector<int32_t>({1, 0, 3, 2}, {4});
  expect_devices_agree([&](const Inputs& x) { return ops::correct_predictions(x[0], on(answers, x[0])); },
                       Inputs{logits});
  for (double squared : {0.25, 4.0, 1.0, static_cast<double>(NAN)})
    expect_devices_agree([](const Inputs& x) { return train::clip_factor(x[0], 1.0); },
                         Inputs{Tensor::full({1}, squared, DType::f32)});
}

TEST(CudaVsCpu, AdamWUpdate) {
  SKIP_WITHOUT_GPU();
  Tensor p = Tensor::uniform({1000}, 30, 0), g = Tensor::uniform({1000}, 31, 0, -0.1, 0.1);
  Tensor m = Tensor::uniform({1000}, 32, 0, -0.01, 0.01), v = Tensor::uniform({1000}, 33, 0, 0.0, 0.01);
  train::AdamWStep s{1e-3, 0.9, 0.98, 1e-9, 0.1, 7};
  Tensor pc = p.clone(), mc = m.clone(), vc = v.clone();
  Tensor pg = p.to(Device::cuda), mg = m.to(Device::cuda), vg = v.to(Device::cuda);
  train::adamw_update(pc, g, mc, vc, s);
  train::adamw_update(pg, g.to(Device::cuda), mg, vg, s);
  EXPECT_LT(rel_diff(pg, pc), 1e-6);
  EXPECT_LT(rel_diff(mg, mc), 1e-6);
  EXPECT_LT(rel_diff(vg, vc), 1e-6);
}

// ---------------------------------------------------------------- cases a review found untested
TEST(CudaVsCpu, Int64LabelsAndEmptyTensors) {
  SKIP_WITHOUT_GPU();
  auto on = [&](const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; };
  Tensor labels = Tensor::from_vector<int64_t>({2, 0, -1, 9, 5, 3, 3}, {7});
  expect_devices_agree([&](const Inputs& x) { return ops::cross_entropy(x[0], on(labels, x[0])); },
                       Inputs{rand32({7, 10}, 40, -3, 3)});
  // zero rows: every op must accept them (no 0-block launch)
  expect_devices_agree([](const Inputs& x) { return ops::add(x[0], x[1]); },
                       Inputs{rand32({0, 5}, 41), rand32({5}, 42)});
  expect_devices_agree([](const Inputs& x) { return ops::sum(x[0], 1); }, Inputs{rand32({0, 5}, 43)});
  expect_devices_agree([](const Inputs& x) { return ops::sum(x[0], 0); }, Inputs{rand32({0, 5}, 44)});
  expect_devices_agree([](const Inputs& x) { return ops::softmax(x[0]); }, Inputs{rand32({0, 7}, 45)});
  expect_devices_agree([](const Inputs& x) { return ops::layernorm(x[0], x[1], x[2]); },
                       Inputs{rand32({0, 9}, 46), rand32({9}, 47), rand32({9}, 48)});
  expect_devices_agree([](const Inputs& x) { return ops::gelu(x[0]); }, Inputs{rand32({0}, 49)});
}

TEST(CudaVsCpu, SoftmaxOfNaNRowsIsNaNOnBothDevices) {
  SKIP_WITHOUT_GPU();
  // an all-NaN row must stay NaN (the training loop stops on it), a fully masked row is 0
  const float nan = std::nanf("");
  Tensor x = Tensor::from_vector<float>({nan, nan, nan, 1, 2, 3}, {2, 3});
  Tensor mask = Tensor::from_vector<float>({1, 1, 1, 0, 0, 0}, {2, 3});
  for (Device d : {Device::cpu, Device::cuda}) {
    auto y = ops::softmax(x.to(d), mask.to(d)).to_double_vector();
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(y[j])) << device_name(d) << " " << j;
    for (int j = 3; j < 6; ++j) EXPECT_EQ(y[j], 0.0) << device_name(d) << " " << j;
  }
}

TEST(CudaVsCpu, GemmWithEmptyInnerDimension) {
  SKIP_WITHOUT_GPU();
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      expect_devices_agree(
          [ta, tb](const Inputs& x) { return ops::matmul(x[0], x[1], ta, tb); },
          Inputs{rand32(ta ? Shape{2, 0, 3} : Shape{2, 3, 0}, 50), rand32(tb ? Shape{2, 4, 0} : Shape{2, 0, 4}, 51)});
}

TEST(CudaVsCpu, TopkRowsShortLongAndWithNaN) {
  SKIP_WITHOUT_GPU();
  auto on = [&](const Tensor& t, const Tensor& like) { return like.is_cuda() ? t.to(Device::cuda) : t; };
  // rows of 700 (longer than a block), and rows with fewer real entries than k
  expect_devices_agree([](const Inputs& x) { return ops::topk(x[0], 40); }, Inputs{rand32({3, 700}, 52, -1, 1, false)});
  std::vector<float> m(2 * 9, 0.f);
  for (int j = 0; j < 3; ++j) m[j] = 1.f;  // row 0: 3 real entries for k = 5
  for (int j = 0; j < 9; ++j) m[9 + j] = 1.f;
  Tensor mask = Tensor::from_vector<float>(m, {2, 9});
  expect_devices_agree([&](const Inputs& x) { return ops::topk(x[0], 5, on(mask, x[0])); },
                       Inputs{rand32({2, 9}, 53, -1, 1, false)});
  // NaN ranks below every number (ties by position): every slot holds a distinct index
  const float nan = std::nanf("");
  Tensor with_nan = Tensor::from_vector<float>({0.5f, nan, 2.f, nan, -1.f, 0.5f, nan, 3.f}, {1, 8});
  expect_devices_agree([](const Inputs& x) { return ops::topk(x[0], 8); }, Inputs{with_nan});
  Tensor cpu_idx = ops::topk(with_nan, 8);
  auto v = cpu_idx.to_double_vector();
  EXPECT_EQ(v, (std::vector<double>{7, 2, 0, 5, 4, 1, 3, 6}));
  // a coarse grid of values (many ties), -0 beside +0 and NaN, rows grouped over a mask, k
  // below, near and at the row length: the radix select must keep the CPU's order exactly
  std::vector<float> grid(6 * 300);
  uint64_t draw = 0;
  for (float& g : grid) {
    const double u = philox::uniform(77, draw++);
    g = static_cast<float>(std::floor(u * 6) / 2 - 1);
    if (u < 0.05) g = -0.0f;
    if (u > 0.97) g = nan;
  }
  std::vector<float> gm(2 * 300, 1.f);
  for (int j = 0; j < 300; j += 3) gm[j] = 0.f;
  const Tensor tied = Tensor::from_vector<float>(grid, {6, 300}), tied_mask = Tensor::from_vector<float>(gm, {2, 300});
  for (int64_t k : {1, 7, 199, 200, 300}) {
    SCOPED_TRACE(fmt::format("k {}", k));
    expect_devices_agree([&](const Inputs& x) { return ops::topk(x[0], k, on(tied_mask, x[0])); }, Inputs{tied});
    expect_devices_agree([&](const Inputs& x) { return ops::topk(x[0], k); }, Inputs{tied});
  }
}

// Column sums (bias gradients) run as a two-stage reduction in the CPU's chunk order, so even a
// sum that cancels to almost nothing, where any other order would differ in the last bits
// relative to the result, is equal on both devices bit for bit.
TEST(CudaVsCpu, ColumnSumsAreTwoStageAndBitIdentical) {
  SKIP_WITHOUT_GPU();
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{3000, 7}, {256, 5}, {257, 3}, {1, 4}, {70000, 2}}) {
    std::vector<float> v(rows * cols);
    uint64_t draw = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {  // large terms that cancel: +u then -u (shifted), small noise
        const float u = static_cast<float>(1000.0 * philox::uniform(5, draw++));
        v[r * cols + c] = (r % 2 ? -u : u) + static_cast<float>(1e-3 * philox::uniform(6, draw++));
      }
    const Tensor x = Tensor::from_vector<float>(v, {rows, cols});
    const std::vector<double> cpu = ops::sum(x, 0).to_double_vector();
    const std::vector<double> gpu = ops::sum(x.to(Device::cuda), 0).to(Device::cpu).to_double_vector();
    EXPECT_EQ(gpu, cpu) << rows << " x " << cols;
    const std::vector<double> cpu_mean = ops::mean(x.view({1, rows, cols}), 1).to_double_vector();
    EXPECT_EQ(ops::mean(x.view({1, rows, cols}).to(Device::cuda), 1).to(Device::cpu).to_double_vector(), cpu_mean);
  }
}

TEST(CudaVsCpu, WideRowsAndSeveralBlocks) {
  SKIP_WITHOUT_GPU();
  expect_devices_agree([](const Inputs& x) { return ops::layernorm(x[0], x[1], x[2]); },
                       Inputs{rand32({5, 700}, 54), rand32({700}, 55), rand32({700}, 56)});  // D > 256
  expect_devices_agree([](const Inputs& x) { return ops::mul(ops::gelu(x[0]), x[1]); },
                       Inputs{rand32({300, 333}, 57), rand32({333}, 58)});  // ~400 blocks
  expect_devices_agree([](const Inputs& x) { return ops::sum(x[0], 0); }, Inputs{rand32({600, 301}, 59)});
  expect_devices_agree([](const Inputs& x) { return ops::softmax(x[0]); }, Inputs{rand32({3, 2000}, 60, -3, 3)});
}

#if defined(CAST_WITH_CUDA)  // the allocator's counters exist only in a CUDA build
#include <cuda_runtime.h>

#include "cuda/rows.h"
#include "cuda/runtime.h"
#include "ops/convert.h"
#include "ops/matmul.h"
#include "tensor/precision.h"

// On the device a range check neither allocates nor copies back: a failure is raised at the
// host's next wait for the device, naming the op, a value found and the allowed range.
TEST(CudaVsCpu, IndexRangeCheckAllocatesNothingAndWaitsForTheNextSync) {
  SKIP_WITHOUT_GPU();
  Tensor table = Tensor::uniform({4, 6}, 61, 0).to(Device::cuda);
  Tensor idx = Tensor::from_vector<int32_t>({0, 3, -1, 2}, {4}).to(Device::cuda);
  ops::check_index_range("test", idx, -1, 4);  // warm-up: the allocator's cache fills
  auto mallocs = [] {
#if defined(CAST_CUDA_EMULATION)
    return emu::runtime_counts().mallocs;  // every cudaMalloc, the allocator's or not
#else
    return cuda::memory_stats().device_mallocs;
#endif
  };
  const uint64_t before = mallocs();
  const size_t copies = cuda::memory_stats().to_host;
  for (int i = 0; i < 5; ++i) ops::check_index_range("test", idx, -1, 4);
  EXPECT_EQ(mallocs(), before);
  EXPECT_EQ(cuda::memory_stats().to_host, copies);
  cuda::synchronize();  // every check passed: nothing raised
  ops::check_index_range("first", idx, -1, 4);
  ops::check_index_range("second", idx, -1, 3);  // 3 is out of range
  EXPECT_CAST_ERROR(cuda::synchronize(), "second: index out of range: 3 found, allowed [-1, 3)");
  cuda::synchronize();  // reported once, then forgotten
  // a copy to the host waits too, and raises it before the value is used
  ops::check_index_range("gather", idx, 0, 4);  // -1 is out of range
  EXPECT_CAST_ERROR(idx.to_double_vector(), "gather: index out of range: -1 found, allowed [0, 4)");
  // the kernels that use indices skip a bad one meanwhile: a gather with an index past the end
  // reads nothing out of bounds and leaves a zero row
  Tensor rows = ops::gather_rows(table.view({1, 4, 6}), Tensor::from_vector<int32_t>({1, 9}, {1, 2}).to(Device::cuda));
  EXPECT_CAST_ERROR(rows.to_double_vector(), "gather_rows: index out of range: 9 found");
  Tensor safe = Tensor::empty({1, 2, 6}, DType::f32, Device::cuda);
  cuda::gather_rows(safe, table.view({1, 4, 6}), Tensor::from_vector<int32_t>({1, 9}, {1, 2}).to(Device::cuda), 1, 4, 2,
                    6, false);
  const std::vector<double> got = safe.to_double_vector(), want = table.to_double_vector();
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(got[j], want[6 + j]);
    EXPECT_EQ(got[6 + j], 0.0);
  }
  // the same with rows of 8, four floats at a time, added into what is there (no check was
  // registered for this direct call: the bad index only leaves its row alone)
  Tensor wide = Tensor::uniform({1, 3, 8}, 24, 0).to(Device::cuda), into = Tensor::full({1, 2, 8}, 1.0, DType::f32, Device::cuda);
  cuda::gather_rows(into, wide, Tensor::from_vector<int32_t>({2, 7}, {1, 2}).to(Device::cuda), 1, 3, 2, 8, true);
  const std::vector<double> got8 = into.to_double_vector(), want8 = wide.to_double_vector();
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(got8[j], static_cast<double>(1.0f + static_cast<float>(want8[16 + j])));
    EXPECT_EQ(got8[8 + j], 1.0);
  }
}

// Tensor::full fills on the device: no copy from the host, the same values in every device dtype.
TEST(CudaVsCpu, FullFillsOnTheDevice) {
  SKIP_WITHOUT_GPU();
  const size_t copies = cuda::memory_stats().to_device;
  std::vector<Tensor> filled;
  for (DType dt : {DType::f32, DType::i32, DType::i64}) filled.push_back(Tensor::full({5, 3}, -1.5, dt, Device::cuda));
  EXPECT_EQ(cuda::memory_stats().to_device, copies);
  for (size_t i = 0; i < filled.size(); ++i)
    EXPECT_EQ(filled[i].to_double_vector(), Tensor::full({5, 3}, -1.5, filled[i].dtype()).to_double_vector());
}


// At --precision bf16, cuBLAS is handed BF16 operands (our kernel rounds each FP32 operand to a
// packed BF16 copy; a BF16 tensor is read as it lies) and sums in FP32. Against the CPU's FP32
// product of the operands rounded to BF16 (tensor/bf16.h), on laid-out matrices: an offset, rows
// wider than the matrix, a weight shared by every product (stride 0), each transpose. Only the
// order of FP32 sums may differ: 1e-5 of the row of products' magnitude.
TEST(CudaVsCpu, Bf16ProductsTakeBf16Operands) {
  SKIP_WITHOUT_GPU();
  const auto rounded = [](const Tensor& x) { return ops::convert(ops::convert(x, DType::bf16), DType::f32); };
  // the copies a product made, by kernel: element by element, or eight at a time
  const auto copies = [](const std::vector<std::string>& launched, const char* kernel) {
    return std::count(launched.begin(), launched.end(), kernel);
  };
  struct Shape3 {
    int64_t m, n, k, offset;
  };
  // odd sizes one element in: element by element; whole eights 16-byte aligned: eight at a time
  for (const Shape3 shape : {Shape3{37, 19, 70, 1}, Shape3{40, 24, 64, 8}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const auto [m, n, k, offset] = shape;
        SCOPED_TRACE(fmt::format("m {} n {} k {} trans_a {} trans_b {}", m, n, k, ta, tb));
        const bool eights = offset % 4 == 0;
        const char* kernel = eights ? "to_bf16_matrices8_kernel" : "to_bf16_matrices_kernel";
        const int64_t batch = 3;
        // a: batch matrices in a wider tensor, rows 80 apart, `offset` elements in; b: one matrix for all
        const Tensor a = rand32({batch, ta ? k : m, 80}, 71, -1.0, 1.0, false);
        const Tensor b = rand32({tb ? n : k, tb ? k : n}, 72, -1.0, 1.0, false);
        const MatrixLayout la{offset, 80, a.dim(1) * 80}, lb{0, b.dim(1), 0}, lc{0, n, m * n};
        const ops::GemmShape s{batch, m, n, k};
        Tensor want = Tensor::empty({batch, m, n}, DType::f32, Device::cpu);
        ops::gemm_laid_out(want, lc, rounded(a), la, rounded(b), lb, ta, tb, 1.0, 0.0, s);
        PrecisionGuard bf16(Precision::bf16);
        std::vector<std::string> launched;
        cuda::set_launch_log(&launched);
        Tensor got = Tensor::full({batch, m, n}, std::nan(""), DType::f32, Device::cuda);
        ops::gemm_laid_out(got, lc, a.to(Device::cuda), la, b.to(Device::cuda), lb, ta, tb, 1.0, 0.0, s);
        cuda::set_launch_log(nullptr);
        EXPECT_EQ(copies(launched, kernel), 2);
        expect_close_per_element(got, want, 1e-5, 1e-5, "product of FP32 operands at bf16");
        // a BF16 operand made once (ops::as_product_operand) is read as it lies: no copy of it
        const Tensor a16 = ops::as_product_operand(a.to(Device::cuda));
        EXPECT_EQ(a16.dtype(), DType::bf16);
        launched.clear();
        cuda::set_launch_log(&launched);
        Tensor got16 = Tensor::full({batch, m, n}, std::nan(""), DType::f32, Device::cuda);
        ops::gemm_laid_out(got16, lc, a16, la, b.to(Device::cuda), lb, ta, tb, 1.0, 0.0, s);
        cuda::set_launch_log(nullptr);
        EXPECT_EQ(copies(launched, kernel), 1);
        expect_close_per_element(got16, want, 1e-5, 1e-5, "product of a BF16 operand");
        // the other way, kept to be timed against (cast bench --bf16-gemm fast16bf): the FP32
        // operands with FAST_16BF, no copy, the same rounding
        set_bf16_gemm(Bf16Gemm::fast16bf);
        launched.clear();
        cuda::set_launch_log(&launched);
        EXPECT_EQ(ops::as_product_operand(a.to(Device::cuda)).dtype(), DType::f32);
        Tensor fast = Tensor::full({batch, m, n}, std::nan(""), DType::f32, Device::cuda);
        ops::gemm_laid_out(fast, lc, a.to(Device::cuda), la, b.to(Device::cuda), lb, ta, tb, 1.0, 0.0, s);
        cuda::set_launch_log(nullptr);
        set_bf16_gemm(Bf16Gemm::bf16_operands);
        EXPECT_EQ(copies(launched, "to_bf16_matrices_kernel") + copies(launched, "to_bf16_matrices8_kernel"), 0);
        expect_close_per_element(fast, want, 1e-5, 1e-5, "product at FAST_16BF");
      }
}

// A BF16 operand is for products at --precision bf16 on CUDA only; anywhere else it is refused.
TEST(CudaVsCpu, Bf16OperandsOutsideBf16ProductsAreRefused) {
  SKIP_WITHOUT_GPU();
  const Tensor a = ops::convert(rand32({4, 4}, 73, -1.0, 1.0, false).to(Device::cuda), DType::bf16);
  const Tensor b = rand32({4, 4}, 74, -1.0, 1.0, false).to(Device::cuda);
  Tensor c = Tensor::empty({4, 4}, DType::f32, Device::cuda);
  EXPECT_CAST_ERROR(ops::gemm_laid_out(c, {0, 4, 16}, a, {0, 4, 16}, b, {0, 4, 16}, false, false, 1.0, 0.0, {1, 4, 4, 4}),
                    "matmul: a BF16 operand a (");
  EXPECT_CAST_ERROR(ops::gemm_laid_out(c, {0, 4, 16}, a, {0, 4, 16}, b, {0, 4, 16}, false, false, 1.0, 0.0, {1, 4, 4, 4}),
                    "at fp32");
  // a product or a linear layer reading a BF16 operand beside an FP32 one: only where products take BF16
  const Tensor bias = rand32({4}, 75, -1.0, 1.0, false).to(Device::cuda);
  EXPECT_CAST_ERROR(ops::matmul_forward(c, a, b, false, false), "matmul: a BF16 operand a (");
  EXPECT_CAST_ERROR(ops::linear(a, b, bias), "linear: a BF16 operand x (");
  PrecisionGuard bf16(Precision::bf16);
  EXPECT_EQ(ops::as_product_operand(b.to(Device::cpu)).dtype(), DType::f32);  // the CPU computes in FP32
  // at bf16 on CUDA: the values of its FP32 form (which the products round to the same BF16)
  EXPECT_EQ(ops::linear(a, b, bias).to_double_vector(), ops::linear(ops::convert(a, DType::f32), b, bias).to_double_vector());
  EXPECT_CAST_ERROR(ops::matmul_forward(c, a, Tensor::zeros({4, 4}, DType::i32, Device::cuda), false, false),
                    "beside f32 or BF16 ones, not");
}
#endif
