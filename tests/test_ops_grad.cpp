// Layer 1: finite-difference gradient checks in f64 for every differentiable op,
// over several shapes including odd sizes.
#include <algorithm>
#include <limits>
#include <string>

#include "autograd/recompute.h"
#include "tensor/precision.h"
#ifdef CAST_WITH_CUDA
#include "cuda/runtime.h"
#endif
#include "tests/devices.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;
using Inputs = std::vector<Tensor>;

// Case names for ctest's output: shapes as 3x5, transposes as T.
static std::string dims(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "x" : "") + std::to_string(s[i]);
  return out;
}

// ---------------------------------------------------------------- broadcasting binary ops
struct BinaryCase {
  Shape a, b;
};
class BinaryGrad : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryGrad, AllFourOps) {
  const BinaryCase c = GetParam();
  Inputs in = {param(c.a, 1), param(c.b, 2, 0.5, 2.0)};  // b away from 0 for div
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::add(x[0], x[1]); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::sub(x[0], x[1]); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::mul(x[0], x[1]); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::div(x[0], x[1]); }, in);
}
INSTANTIATE_TEST_SUITE_P(Shapes, BinaryGrad,
                         ::testing::Values(BinaryCase{{3, 5}, {3, 5}}, BinaryCase{{3, 5}, {5}},
                                           BinaryCase{{2, 1, 5}, {3, 1}}, BinaryCase{{7}, {2, 7}},
                                           BinaryCase{{1}, {3, 2}}),
                         [](const auto& info) { return dims(info.param.a) + "_with_" + dims(info.param.b); });

TEST(Grad, Affine) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::affine(x[0], -0.7, 0.3); }, Inputs{param({3, 7}, 3)});
}

// ---------------------------------------------------------------- reductions
class ReduceGrad : public ::testing::TestWithParam<int> {};
TEST_P(ReduceGrad, SumAndMean) {
  const int axis = GetParam();
  Inputs in = {param({3, 5, 2}, 4)};
  EXPECT_GRADCHECK([axis](const Inputs& x) { return ops::sum(x[0], axis); }, in);
  EXPECT_GRADCHECK([axis](const Inputs& x) { return ops::mean(x[0], axis, true); }, in);
}
INSTANTIATE_TEST_SUITE_P(Axes, ReduceGrad, ::testing::Values(0, 1, 2, -1), [](const auto& info) {
  return info.param < 0 ? "axis_last" : "axis_" + std::to_string(info.param);
});

TEST(Grad, SumAllMeanAll) {
  Inputs in = {param({4, 3}, 5)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::sum_all(x[0]); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::mean_all(x[0]); }, in);
}

// ---------------------------------------------------------------- elementwise functions
struct UnaryCase {
  UnaryOp op;
  double lo, hi;  // input range: positive for log/sqrt, off the kink for relu
};
class UnaryGrad : public ::testing::TestWithParam<UnaryCase> {};
TEST_P(UnaryGrad, OddShapes) {
  const UnaryCase c = GetParam();
  for (Shape s : {Shape{1}, Shape{7}, Shape{3, 5}}) {
    Tensor x = param(s, 6, c.lo, c.hi);
    if (c.op == UnaryOp::relu) {  // keep every element at least 0.1 from the kink
      double* p = x.data<double>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] += p[i] >= 0 ? 0.1 : -0.1;
    }
    EXPECT_GRADCHECK([&](const Inputs& in) { return ops::unary(c.op, in[0]); }, Inputs{x});
  }
}
INSTANTIATE_TEST_SUITE_P(Functions, UnaryGrad,
                         ::testing::Values(UnaryCase{UnaryOp::exp, -2, 2}, UnaryCase{UnaryOp::log, 0.2, 3},
                                           UnaryCase{UnaryOp::sqrt, 0.2, 3}, UnaryCase{UnaryOp::relu, -1, 1},
                                           UnaryCase{UnaryOp::gelu, -3, 3}, UnaryCase{UnaryOp::sigmoid, -4, 4},
                                           UnaryCase{UnaryOp::laplace, -1, 2}),
                         [](const auto& info) { return std::string(unary_name(info.param.op)); });

// ---------------------------------------------------------------- softmax family
TEST(Grad, SoftmaxAndLogSoftmax) {
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 3, 5}}) {
    Inputs in = {param(s, 7, -2, 2)};
    EXPECT_GRADCHECK([](const Inputs& x) { return ops::softmax(x[0]); }, in);
    EXPECT_GRADCHECK([](const Inputs& x) { return ops::log_softmax(x[0]); }, in);
  }
}

TEST(Grad, SoftmaxWithKeyMask) {
  // scores (B=2, H=2, N=3, N=4), key mask (B, N) with a fully masked batch row 1? no: one padded key each
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1, 1, 0, 0, 0}, {2, 4});
  Inputs in = {param({2, 2, 3, 4}, 8, -2, 2)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::softmax(x[0], mask); }, in);
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::log_softmax(x[0], mask); }, in);
}

TEST(Grad, SoftmaxFullyMaskedRowHasZeroGradient) {
  Tensor mask = Tensor::from_vector<double>({0, 0, 0, 1, 1, 1}, {2, 3});
  Tensor x = param({2, 3}, 9);
  Tensor y = ops::softmax(x, mask);
  expect_values(ops::reshape(y, {6}).to(DType::f64),
                {0, 0, 0, y.data<double>()[3], y.data<double>()[4], y.data<double>()[5]});
  autograd::backward(y, Tensor::full({2, 3}, 1.0, DType::f64));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(x.grad().data<double>()[i], 0.0);
  EXPECT_GRADCHECK([&](const Inputs& in) { return ops::softmax(in[0], mask); }, Inputs{param({2, 3}, 10)});
}

TEST(Grad, LayerNorm) {
  for (Shape s : {Shape{1, 3}, Shape{4, 5}, Shape{2, 3, 7}}) {
    const int64_t d = s.back();
    Inputs in = {param(s, 11, -2, 2), param({d}, 12, 0.5, 1.5), param({d}, 13)};
    EXPECT_GRADCHECK([](const Inputs& x) { return ops::layernorm(x[0], x[1], x[2]); }, in);
  }
}

// ---------------------------------------------------------------- matmul
struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};
class MatmulGrad : public ::testing::TestWithParam<MatmulCase> {};
TEST_P(MatmulGrad, Shapes) {
  const MatmulCase c = GetParam();
  Inputs in = {param(c.a, 14), param(c.b, 15)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::matmul(x[0], x[1], c.ta, c.tb); }, in);
}
INSTANTIATE_TEST_SUITE_P(
    Transposes, MatmulGrad,
    ::testing::Values(MatmulCase{{3, 4}, {4, 5}, false, false}, MatmulCase{{4, 3}, {4, 5}, true, false},
                      MatmulCase{{3, 4}, {5, 4}, false, true}, MatmulCase{{4, 3}, {5, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {2, 4, 5}, false, false}, MatmulCase{{2, 4, 3}, {2, 5, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {2, 5, 4}, false, true}, MatmulCase{{2, 3, 5, 7}, {7, 3}, false, false},
                      MatmulCase{{1, 1}, {1, 1}, false, false}, MatmulCase{{2, 3, 4}, {5, 4}, false, true}),
    [](const auto& info) {
      const MatmulCase& c = info.param;
      return dims(c.a) + (c.ta ? "T" : "") + "_times_" + dims(c.b) + (c.tb ? "T" : "") + "_" +
             std::to_string(info.index);
    });

// ---------------------------------------------------------------- layout
TEST(Grad, ReshapePermuteTranspose) {
  Inputs in = {param({2, 3, 4}, 16)};
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::reshape(x[0], {4, -1}); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::permute(x[0], {2, 0, 1}); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::transpose(x[0], 0, 2); }, in);
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::permute(ops::reshape(x[0], {2, 3, 2, 2}), {0, 2, 1, 3}); }, in);
}

TEST(Grad, ConcatAndSplit) {
  for (int axis : {0, 1, 2}) {
    Shape sa = {2, 3, 4}, sb = {2, 3, 4};
    sb[axis] = 1;
    Inputs in = {param(sa, 17), param(sb, 18)};
    EXPECT_GRADCHECK([axis](const Inputs& x) { return ops::concat({x[0], x[1]}, axis); }, in);
    EXPECT_GRADCHECK(
        [axis](const Inputs& x) {
          auto parts = ops::split(x[0], {1, x[0].dim(axis) - 1}, axis);
          return ops::mul(parts[1], parts[1]);  // only one piece used: the other gets no gradient
        },
        Inputs{in[0]});
  }
}

// ---------------------------------------------------------------- rows, embedding, pooling
TEST(Grad, GatherAndScatterRows) {
  Tensor idx = Tensor::from_vector<int32_t>({2, 0, -1, 2, 1, 1, 3, -1, 0, 0}, {2, 5});
  Inputs in = {param({2, 4, 3}, 19)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::gather_rows(x[0], idx); }, in);
  Inputs src = {param({2, 5, 3}, 20)};
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::scatter_add_rows(x[0], idx, 4); }, src);
}

TEST(Grad, Embedding) {
  Tensor idx = Tensor::from_vector<int64_t>({3, 0, 3, 1, 4, 4}, {2, 3});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::embedding(x[0], idx); }, Inputs{param({5, 3}, 21)});
}

TEST(Grad, MaskedMean) {
  Tensor mask = Tensor::from_vector<double>({1, 1, 0, 1, 0, 0, 0, 0}, {2, 4});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::masked_mean(x[0], mask); }, Inputs{param({2, 4, 3}, 22)});
}

TEST(Grad, CrossEntropy) {
  Tensor labels = Tensor::from_vector<int32_t>({2, 0, -1, 4}, {4});
  EXPECT_GRADCHECK([&](const Inputs& x) { return ops::cross_entropy(x[0], labels); }, Inputs{param({4, 5}, 23, -2, 2)});
}

TEST(Grad, Dropout) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::dropout(x[0], 0.3, 99, 7); }, Inputs{param({5, 7}, 24)});
}

// x + dropout(t) as one op: alone, with its stream read again later (x's gradient added into,
// not taken over), and with t = x.
TEST(Grad, DropoutAdd) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::dropout_add(x[0], x[1], 0.3, 99, 7); },
                   (Inputs{param({5, 7}, 24), param({5, 7}, 25)}));
  EXPECT_GRADCHECK(
      [](const Inputs& x) { return ops::mul(ops::dropout_add(x[0], ops::gelu(x[1]), 0.5, 3, 11), ops::add(x[0], x[1])); },
      (Inputs{param({3, 4}, 26), param({3, 4}, 27)}));
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::dropout_add(x[0], x[0], 0.2, 5, 0); }, Inputs{param({9}, 28)});
}

// ops::dropout_add, the fast path, gives what its reference add(x, dropout(t)) gives, bit for bit,
// on every device here, in f32 and f64 (the CPU's), over odd shapes (one past a chunk of the CPU's
// words, and empty): the forward writes every element of a buffer poisoned with NaN; recorded in
// a graph that reads the stream again (x's gradient added into), in one where x takes the
// output's gradient buffer over (the op inside the graph), with t = x and a gradient of x before,
// and alone (the output's gradient is the caller's, so x's is a copy of it).
TEST(Grad, DropoutAddAgreesWithItsTwoOps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (Device device : devices_here())
    for (DType dtype : {DType::f32, DType::f64})
      for (const Shape& shape : {Shape{5, 7}, Shape{2, 3, 1025}, Shape{0, 7}}) {
        if (device == Device::cuda && dtype == DType::f64) continue;  // the device runs f32
        SCOPED_TRACE(dims(shape) + " " + device_name(device) + " " + dtype_name(dtype));
        auto on = [&](const Tensor& t) { return t.to(dtype).to(device); };
        const Tensor x = on(param(shape, 71)), t = on(param(shape, 72)), c = on(param(shape, 73));
        const Tensor ones = on(Tensor::full(shape, 1.0, DType::f64));
        const double p = 0.35;
        const uint64_t seed = 1234, offset = 77;
        Tensor y = on(Tensor::full(shape, nan, DType::f64));
        ops::dropout_add_forward(y, x, t, p, seed, offset);
        Tensor rx = x.clone().set_requires_grad(), rt = t.clone().set_requires_grad();
        const Tensor ry = ops::add(rx, ops::dropout(rt, p, seed, offset));
        EXPECT_EQ(y.to_double_vector(), ry.to_double_vector());
        autograd::backward(ops::add(ops::mul(ry, c), rx), ones);
        Tensor fx = x.clone().set_requires_grad(), ft = t.clone().set_requires_grad();
        autograd::backward(ops::add(ops::mul(ops::dropout_add(fx, ft, p, seed, offset), c), fx), ones);
        EXPECT_EQ(fx.grad().to_double_vector(), rx.grad().to_double_vector());
        EXPECT_EQ(ft.grad().to_double_vector(), rt.grad().to_double_vector());
        // inside the graph, read once: x takes the buffer over
        Tensor px = x.clone().set_requires_grad(), pt = t.clone().set_requires_grad();
        Tensor qx = x.clone().set_requires_grad(), qt = t.clone().set_requires_grad();
        autograd::backward(ops::mul(ops::add(qx, ops::dropout(qt, p, seed, offset)), c), ones);
        autograd::backward(ops::mul(ops::dropout_add(px, pt, p, seed, offset), c), ones);
        EXPECT_EQ(px.grad().to_double_vector(), qx.grad().to_double_vector());
        EXPECT_EQ(pt.grad().to_double_vector(), qt.grad().to_double_vector());
        // t = x, whose gradient the graph's last op gives first
        Tensor sx = x.clone().set_requires_grad(), ux = x.clone().set_requires_grad();
        autograd::backward(ops::add(ops::mul(ops::add(ux, ops::dropout(ux, p, seed, offset)), c), ux), ones);
        autograd::backward(ops::add(ops::mul(ops::dropout_add(sx, sx, p, seed, offset), c), sx), ones);
        EXPECT_EQ(sx.grad().to_double_vector(), ux.grad().to_double_vector());
        // alone: the output's gradient is the caller's, so x's is a copy of it, never that buffer
        Tensor ax = x.clone().set_requires_grad(), at = t.clone().set_requires_grad();
        const Tensor ay = ops::dropout_add(ax, at, p, seed, offset);
        autograd::backward(ay, c);
        EXPECT_EQ(ax.grad().to_double_vector(), c.to_double_vector());
        if (c.numel() > 0) EXPECT_NE(ax.grad().raw_data(), ay.grad().raw_data());
        Tensor dt = on(Tensor::zeros(shape, DType::f64));
        ops::dropout_backward(dt, c, p, seed, offset);
        EXPECT_EQ(at.grad().to_double_vector(), dt.to_double_vector());
      }
}

// An add or sub inside a graph (not the output, whose gradient the caller keeps): the first
// input may take the output's gradient buffer itself (autograd::pass_gradient). Cases: a residual
// stream, a broadcast second input, an input that reaches the node before and after another use,
// a + a, and sub's negated second input.
TEST(Grad, AddAndSubPassTheGradientThrough) {
  EXPECT_GRADCHECK(
      [](const Inputs& x) {
        Tensor h = ops::add(x[0], ops::gelu(x[0]));                  // a residual: x[0] twice
        Tensor g = ops::sub(ops::mul(h, x[1]), ops::sigmoid(x[2]));  // sub of a broadcast (5) from (3, 5)
        Tensor twice = ops::add(g, g);                               // a + a
        return ops::mul(ops::add(twice, x[2]), ops::add(h, x[0]));
      },
      (Inputs{param({3, 5}, 27), param({3, 5}, 28), param({5}, 29)}));
}

// The buffer that passes through goes to one input: the other's gradient is its own copy.
TEST(Grad, APassedGradientIsNotShared) {
  Tensor a = param({4, 6}, 30), b = param({4, 6}, 31), c = param({4, 6}, 32);
  Tensor loss = ops::sum_all(ops::mul(ops::add(a, b), c));
  autograd::backward(loss);
  ASSERT_TRUE(a.grad().defined() && b.grad().defined());
  EXPECT_NE(a.grad().data<double>(), b.grad().data<double>());
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_EQ(a.grad().data<double>()[i], c.data<double>()[i]);
    EXPECT_EQ(b.grad().data<double>()[i], c.data<double>()[i]);
  }
  a.grad().fill_zero();
  EXPECT_EQ(b.grad().data<double>()[5], c.data<double>()[5]);
}

TEST(Grad, Linear) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::linear(x[0], x[1], x[2]); },
                   (Inputs{param({2, 3, 4}, 33), param({4, 5}, 34), param({5}, 35)}));
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::gelu(ops::linear(x[0], x[1], x[2])); },
                   (Inputs{param({3, 4}, 36), param({4, 2}, 37), param({2}, 38)}));
}

TEST(Grad, Mlp) {
  EXPECT_GRADCHECK([](const Inputs& x) { return ops::mlp(x[0], x[1], x[2], x[3], x[4]); },
                   (Inputs{param({2, 3, 4}, 60), param({4, 6}, 61), param({6}, 62), param({6, 5}, 63), param({5}, 64)}));
}

// ops::mlp, the fast path, gives what its reference (linear, gelu, linear) gives, bit for bit, on
// every device here: the same ops on the same values, GELU formed again in the backward by the
// same kernel; in f32 and f64 (the CPU's), over odd shapes; its forward and backward write every
// element of buffers poisoned with NaN first, and a second backward adds into the gradients. On
// CUDA also at --precision bf16, where the fast op writes its hidden activation in BF16 and the
// reference rounds an FP32 one for the products: the same values, so the same bits. Hidden widths
// 9 and 16: the products' copies then run their element and their eights kernels.
TEST(Grad, MlpAgreesWithItsThreeOps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (Device device : devices_here())
    for (DType dtype : {DType::f32, DType::f64})
      for (Precision precision : {Precision::fp32, Precision::bf16})
        for (int64_t hidden : {9, 16}) {
      if (device == Device::cuda && dtype == DType::f64) continue;  // the device runs f32
      if (precision == Precision::bf16 && device != Device::cuda) continue;  // the CPU computes f32 and f64
      const PrecisionGuard at(precision);
      for (const Shape& xs : {Shape{5, 7}, Shape{2, 3, 7}, Shape{1, 1, 7}, Shape{0, 7}}) {
        SCOPED_TRACE(dims(xs) + " " + device_name(device) + " " + dtype_name(dtype) + " " +
                     precision_name(precision) + " hidden " + std::to_string(hidden));
        auto on = [&](const Tensor& t) { return t.to(dtype).to(device); };
        const Tensor x = on(param(xs, 65)), w1 = on(param({7, hidden}, 66)), b1 = on(param({hidden}, 67)),
                     w2 = on(param({hidden, 6}, 68)), b2 = on(param({6}, 69));
        Shape ys = xs, zs = xs;
        ys.back() = 6, zs.back() = hidden;
        const Tensor dy = on(param(ys, 70));
        // the reference, recorded
        std::vector<Tensor> r;
        for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) r.push_back(t->clone().set_requires_grad());
        const Tensor ry = ops::linear(ops::gelu(ops::linear(r[0], r[1], r[2])), r[3], r[4]);
        autograd::backward(ry, dy);
        // the fast op's forward and backward, into poisoned buffers, then added into once more
        Tensor y = on(Tensor::full(ys, nan, DType::f64)), z = on(Tensor::full(zs, nan, DType::f64));
        std::vector<std::string> launched;
#ifdef CAST_WITH_CUDA
        if (device == Device::cuda) cuda::set_launch_log(&launched);
#endif
        ops::mlp_forward(y, z, x, w1, b1, w2, b2);
        EXPECT_EQ(y.to_double_vector(), ry.to_double_vector());
        std::vector<Tensor> d;
        for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) d.push_back(on(Tensor::full(t->shape(), nan, DType::f64)));
        ops::MlpGrads g{&d[0], &d[1], &d[2], &d[3], &d[4]};
        ops::mlp_backward(g, dy, x, z, w1, w2);
#ifdef CAST_WITH_CUDA
        cuda::set_launch_log(nullptr);
#endif
        if (device == Device::cuda && x.numel() > 0) {  // a BF16 activation at bf16, formed by the BF16 kernels
          const auto count = [&](const std::string& name) { return std::count(launched.begin(), launched.end(), name); };
          const bool bf16 = precision == Precision::bf16;
          EXPECT_EQ(count("bias_gelu_kernel<uint16_t>"), bf16 ? 1 : 0);
          EXPECT_EQ(count("gelu_bf16_kernel"), bf16 ? 1 : 0);
          EXPECT_EQ(count("unary_forward_kernel"), bf16 ? 0 : 1);
        }
        for (int i = 0; i < 5; ++i) EXPECT_EQ(d[i].to_double_vector(), r[i].grad().to_double_vector()) << i;
        for (double& beta : g.beta) beta = 1.0;
        ops::mlp_backward(g, dy, x, z, w1, w2);
        for (int i = 0; i < 5; ++i) {
          std::vector<double> twice = r[i].grad().to_double_vector();
          for (double& v : twice) v += v;  // exact: the same gradient added to itself
          EXPECT_EQ(d[i].to_double_vector(), twice) << i << " added into";
        }
        // and recorded: the same gradients through the tape
        std::vector<Tensor> f;
        for (const Tensor* t : {&x, &w1, &b1, &w2, &b2}) f.push_back(t->clone().set_requires_grad());
        autograd::backward(ops::mlp(f[0], f[1], f[2], f[3], f[4]), dy);
        for (int i = 0; i < 5; ++i) EXPECT_EQ(f[i].grad().to_double_vector(), r[i].grad().to_double_vector()) << i;
      }
    }
}

// autograd::recompute_in_backward: a piece run unrecorded, kept by its input alone and run again
// in the backward, has the gradients of the piece itself: its input read twice, two parameters,
// one recomputed piece inside another (as a CAST op that forms its forward again runs inside a
// recomputed block), and a piece whose input needs no gradient but whose parameters do.
static Tensor piece(const Tensor& x, const Tensor& w, const Tensor& b) {
  return ops::mul(ops::gelu(ops::linear(x, w, b)), x);  // x: (3, 4), w: (4, 4), b: (4)
}
static Tensor recomputed_piece(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor out;
  {
    autograd::NoGradGuard unrecorded;
    out = piece(x, w, b);
  }
  return autograd::recompute_in_backward("piece", x, out, {&w, &b}, [w, b](const Tensor& in) { return piece(in, w, b); });
}

TEST(Grad, RecomputeInBackward) {
  EXPECT_GRADCHECK([](const Inputs& x) { return recomputed_piece(x[0], x[1], x[2]); },
                   (Inputs{param({3, 4}, 50), param({4, 4}, 51), param({4}, 52)}));
  EXPECT_GRADCHECK(
      ([](const Inputs& x) {
        const Tensor w = x[1], b = x[2];
        auto twice = [w, b](const Tensor& in) { return recomputed_piece(recomputed_piece(in, w, b), w, b); };
        Tensor out;
        {
          autograd::NoGradGuard unrecorded;
          out = twice(x[0]);
        }
        return autograd::recompute_in_backward("outer", x[0], out, {&w, &b}, twice);
      }),
      (Inputs{param({3, 4}, 53), param({4, 4}, 54), param({4}, 55)}));
  EXPECT_GRADCHECK([](const Inputs& x) { return recomputed_piece(x[0], x[1], x[2]); },
                   (Inputs{constant({3, 4}, 56), param({4, 4}, 57), param({4}, 58)}));
}

// ops::linear, the fast path, gives what its reference (matmul, then add) gives, bit for bit:
// the same product, then the same add, in f32 and f64, over odd shapes; its forward and
// backward write every element of buffers poisoned with NaN first.
TEST(Grad, LinearAgreesWithMatmulAndAdd) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dtype : {DType::f32, DType::f64})
    for (const Shape& xs : {Shape{5, 7}, Shape{2, 3, 7}, Shape{1, 1, 7}, Shape{0, 7}}) {
      SCOPED_TRACE(dims(xs));
      const Tensor x = param(xs, 40).to(dtype), w = param({7, 6}, 41).to(dtype), b = param({6}, 42).to(dtype);
      Shape ys = xs;
      ys.back() = 6;
      const Tensor dy = param(ys, 43).to(dtype);
      // the reference, recorded
      Tensor rx = x.clone().set_requires_grad(), rw = w.clone().set_requires_grad(), rb = b.clone().set_requires_grad();
      const Tensor ry = ops::add(ops::matmul(rx, rw), rb);
      autograd::backward(ry, dy);
      // the fast op's forward and backward, into poisoned buffers
      Tensor y = Tensor::full(ys, nan, dtype), dx = Tensor::full(xs, nan, dtype), dw = Tensor::full({7, 6}, nan, dtype),
             db = Tensor::full({6}, nan, dtype);
      ops::linear_forward(y, x, w, b);
      ops::linear_backward(&dx, &dw, &db, dy, x, w, 0.0, 0.0, 0.0);
      EXPECT_EQ(y.to_double_vector(), ry.to_double_vector());
      EXPECT_EQ(dx.to_double_vector(), rx.grad().to_double_vector());
      EXPECT_EQ(dw.to_double_vector(), rw.grad().to_double_vector());
      EXPECT_EQ(db.to_double_vector(), rb.grad().to_double_vector());
      // and recorded: the same gradients through the tape
      Tensor fx = x.clone().set_requires_grad(), fw = w.clone().set_requires_grad(), fb = b.clone().set_requires_grad();
      autograd::backward(ops::linear(fx, fw, fb), dy);
      EXPECT_EQ(fx.grad().to_double_vector(), rx.grad().to_double_vector());
      EXPECT_EQ(fw.grad().to_double_vector(), rw.grad().to_double_vector());
      EXPECT_EQ(fb.grad().to_double_vector(), rb.grad().to_double_vector());
    }
}

TEST(Grad, ComposedGraphReusesATensor) {
  // x feeds three ops: gradients from every use must add up.
  EXPECT_GRADCHECK(
      [](const Inputs& x) {
        Tensor h = ops::gelu(ops::matmul(x[0], x[1]));
        return ops::add(ops::mul(h, x[0]), ops::softmax(x[0]));
      },
      (Inputs{param({3, 3}, 25), param({3, 3}, 26)}));
}
