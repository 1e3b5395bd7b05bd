// The CPU fast paths under the primitive ops against their readable references: the BLAS
// matmul and the fused kernels' tile kernel against the plain loops (every transpose case,
// batches, edge sizes, empty and k = 0 products), and the row-wise broadcasting loops against
// element-by-element arithmetic.
#include "ops/attention/full_attention_flash.h"
#include "ops/matmul.h"
#include "tests/test_util.h"

using namespace cast;
using namespace cast::testing;

namespace {

template <class T>
void check_gemm(const ops::GemmShape& s, bool ta, bool tb, double alpha, double beta, double tol) {
  SCOPED_TRACE(fmt::format("batch {} m {} n {} k {} ta {} tb {} beta {}", s.batch, s.m, s.n, s.k, ta, tb, beta));
  const DType dt = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  Tensor a = Tensor::uniform({s.batch, s.m * s.k}, 1, 0, -1.0, 1.0, dt);
  Tensor b = Tensor::uniform({s.batch, s.k * s.n}, 2, 0, -1.0, 1.0, dt);
  Tensor c0 = Tensor::uniform({s.batch, s.m * s.n}, 3, 0, -1.0, 1.0, dt);
  Tensor c_blas = c0.clone(), c_loops = c0.clone();
  ops::gemm_blas<T>(c_blas.data<T>(), a.data<T>(), b.data<T>(), ta, tb, T(alpha), T(beta), s);
  ops::gemm_loops<T>(c_loops.data<T>(), a.data<T>(), b.data<T>(), ta, tb, T(alpha), T(beta), s);
  auto x = c_blas.to_double_vector(), y = c_loops.to_double_vector();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], y[i], tol * (1 + std::abs(y[i]))) << "element " << i;
}

}  // namespace

TEST(BlasGemm, MatchesPlainLoopsInEveryCase) {
  const ops::GemmShape shapes[] = {{1, 1, 1, 1}, {1, 7, 5, 3}, {3, 33, 17, 65}, {2, 130, 70, 257},
                                   {5, 4, 9, 0}, {1, 0, 4, 3}, {40, 16, 16, 16}};
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double beta : {0.0, 1.0, 0.5}) {
          check_gemm<float>(s, ta, tb, 0.7, beta, 2e-5);
          check_gemm<double>(s, ta, tb, 0.7, beta, 1e-12);
        }
}

TEST(BlasGemm, BetaZeroOverwritesPoison) {
  // beta 0 must not read C: a NaN there (the poisoned new tensor) may not leak through.
  Tensor a = Tensor::uniform({4, 3}, 1, 0, -1.0, 1.0), b = Tensor::uniform({3, 5}, 2, 0, -1.0, 1.0);
  Tensor c = Tensor::full({4, 5}, std::nan(""));
  ops::gemm_blas<float>(c.data<float>(), a.data<float>(), b.data<float>(), false, false, 1.0f, 0.0f, {1, 4, 5, 3});
  for (double v : c.to_double_vector()) EXPECT_TRUE(std::isfinite(v));
}

// Sizes around the kernel's 6-row and 16- or 32-column blocks, the flash tiles (64 queries ×
// 128 keys, head width 64), and empty products. C starts as NaN where beta is 0, so a kernel
// that reads it shows.
TEST(TileGemm, MatchesPlainLoopsInEveryCase) {
  const int64_t sizes[] = {0, 1, 5, 6, 7, 16, 17, 31, 33, 64, 128, 130};
  int cases = 0;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{64}, int64_t{129}}) {
        if ((m * 7 + n * 3 + k) % 4 != 0 && !(m == 64 && (n == 128 || n == 64))) continue;  // a spread, not all
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (double beta : {0.0, 1.0, -0.5}) {
              SCOPED_TRACE(fmt::format("m {} n {} k {} ta {} tb {} beta {}", m, n, k, ta, tb, beta));
              Tensor a = Tensor::uniform({std::max<int64_t>(m * k, 1)}, 11, 0, -1.0, 1.0);
              Tensor b = Tensor::uniform({std::max<int64_t>(k * n, 1)}, 12, 0, -1.0, 1.0);
              Tensor c = beta == 0.0 ? Tensor::full({std::max<int64_t>(m * n, 1)}, std::nan(""))
                                     : Tensor::uniform({std::max<int64_t>(m * n, 1)}, 13, 0, -1.0, 1.0);
              Tensor c_loops = c.clone();
              ops::gemm_tile_kernel(c.data<float>(), a.data<float>(), b.data<float>(), ta, tb, 0.7f, float(beta), m, n,
                                    k);
              ops::gemm_loops<float>(c_loops.data<float>(), a.data<float>(), b.data<float>(), ta, tb, 0.7f, float(beta),
                                     {1, m, n, k});
              auto x = c.to_double_vector(), y = c_loops.to_double_vector();
              for (int64_t i = 0; i < m * n; ++i)
                ASSERT_NEAR(x[i], y[i], 2e-5 * (1 + std::abs(y[i]) + k)) << "element " << i;
              ++cases;
            }
      }
  EXPECT_GT(cases, 300);
}

// The small products matmul runs on every thread (cpu/gemm_tile.h's gemm_small): batched, row
// blocks of 48 and their remainders, every transpose, beta 0 over NaN.
TEST(TileGemm, SmallProductsOnEveryThreadMatchPlainLoops) {
  const ops::GemmShape shapes[] = {{1, 1, 1, 1},       {1, 1568, 64, 64},   {3, 50, 33, 17},
                                   {2, 197, 130, 129}, {1, 64, 64, 1568},   {4, 5, 7, 0},
                                   {1, 0, 3, 4},       {1, 200, 512, 2048}, {0, 200, 3, 4}};
  for (const auto& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double beta : {0.0, 1.0}) {
          SCOPED_TRACE(
              fmt::format("batch {} m {} n {} k {} ta {} tb {} beta {}", s.batch, s.m, s.n, s.k, ta, tb, beta));
          const int64_t cn = std::max<int64_t>(s.batch * s.m * s.n, 1);
          Tensor a = Tensor::uniform({std::max<int64_t>(s.batch * s.m * s.k, 1)}, 21, 0, -1.0, 1.0);
          Tensor b = Tensor::uniform({std::max<int64_t>(s.batch * s.k * s.n, 1)}, 22, 0, -1.0, 1.0);
          Tensor c = beta == 0.0 ? Tensor::full({cn}, std::nan("")) : Tensor::uniform({cn}, 23, 0, -1.0, 1.0);
          Tensor c_loops = c.clone();
          ops::gemm_small(c.data<float>(), a.data<float>(), b.data<float>(), ta, tb, 0.7f, float(beta), s.batch, s.m,
                          s.n, s.k);
          ops::gemm_loops<float>(c_loops.data<float>(), a.data<float>(), b.data<float>(), ta, tb, 0.7f, float(beta), s);
          auto x = c.to_double_vector(), y = c_loops.to_double_vector();
          for (int64_t i = 0; i < s.batch * s.m * s.n; ++i)
            ASSERT_NEAR(x[i], y[i], 2e-5 * (1 + std::abs(y[i]) + s.k)) << "element " << i;
        }
}

TEST(TileGemm, IsWhatTheFusedKernelsRun) {
  // the default, and the switch `cast bench --tile-gemm` uses
  EXPECT_EQ(ops::tile_gemm(), ops::TileGemm::kernel);
  Tensor a = Tensor::uniform({6 * 5}, 1, 0, -1.0, 1.0), b = Tensor::uniform({5 * 9}, 2, 0, -1.0, 1.0);
  Tensor c1 = Tensor::zeros({6 * 9}), c2 = Tensor::zeros({6 * 9});
  ops::gemm_tile<float>(c1.data<float>(), a.data<float>(), b.data<float>(), false, false, 1.0f, 0.0f, 6, 9, 5);
  ops::set_tile_gemm(ops::TileGemm::blas);
  ops::gemm_tile<float>(c2.data<float>(), a.data<float>(), b.data<float>(), false, false, 1.0f, 0.0f, 6, 9, 5);
  ops::set_tile_gemm(ops::TileGemm::kernel);
  auto x = c1.to_double_vector(), y = c2.to_double_vector();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], y[i], 1e-5);
}

TEST(BroadcastLoops, EveryStrideCaseAgainstElementwise) {
  // (row, column, scalar and full broadcasts) on both sides, forward and both gradients
  const std::vector<std::pair<Shape, Shape>> cases = {{{3, 4, 5}, {3, 4, 5}}, {{3, 4, 5}, {5}},       {{5}, {3, 4, 5}},
                                                      {{3, 4, 5}, {3, 4, 1}}, {{3, 1, 5}, {1, 4, 1}}, {{2, 3, 1}, {1}},
                                                      {{1}, {2, 3, 4}}};
  for (auto& [sa, sb] : cases)
    for (int op = 0; op < 4; ++op) {
      SCOPED_TRACE(fmt::format("{} op {} {}", shape_str(sa), op, shape_str(sb)));
      Tensor a = param(sa, 10), b = param(sb, 11, 0.5, 1.5);
      Tensor out;
      switch (op) {
        case 0: out = ops::add(a, b); break;
        case 1: out = ops::sub(a, b); break;
        case 2: out = ops::mul(a, b); break;
        default: out = ops::div(a, b);
      }
      Shape so = out.shape();
      Tensor dout = constant(so, 12);
      autograd::backward(out, dout);
      // element by element: index each input by broadcasting the output index
      auto va = a.to_double_vector(), vb = b.to_double_vector(), vo = out.to_double_vector(),
           vd = dout.to_double_vector();
      std::vector<double> ga(va.size(), 0.0), gb(vb.size(), 0.0);
      const int nd = static_cast<int>(so.size());
      for (int64_t i = 0; i < out.numel(); ++i) {
        int64_t rest = i, ia = 0, ib = 0, mult_a = 1, mult_b = 1;
        for (int d = nd - 1; d >= 0; --d) {
          const int64_t c = rest % so[d];
          rest /= so[d];
          const int da = d - (nd - static_cast<int>(sa.size())), db = d - (nd - static_cast<int>(sb.size()));
          if (da >= 0) {
            ia += (sa[da] == 1 ? 0 : c) * mult_a;
            mult_a *= sa[da];
          }
          if (db >= 0) {
            ib += (sb[db] == 1 ? 0 : c) * mult_b;
            mult_b *= sb[db];
          }
        }
        const double x = va[ia], y = vb[ib];
        const double want = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
        ASSERT_NEAR(vo[i], want, 1e-12) << "output " << i;
        ga[ia] += vd[i] * (op == 2 ? y : op == 3 ? 1 / y : 1.0);
        gb[ib] += vd[i] * (op == 0 ? 1.0 : op == 1 ? -1.0 : op == 2 ? x : -x / (y * y));
      }
      expect_values(a.grad(), ga, 1e-12);
      expect_values(b.grad(), gb, 1e-12);
    }
}

TEST(UnaryF32Forms, AgreeWithDoublePrecision) {
  // the vectorised f32 forms of GELU, the Laplace function and sigmoid, and their derivatives,
  // against the f64 library formulas over the whole range a network sees
  std::vector<double> xs;
  for (double x = -30.0; x <= 30.0; x += 0.01) xs.push_back(x);
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor x64 = Tensor::from_vector<double>(xs, {n});
  Tensor x32 = x64.to(DType::f32);
  x32.set_requires_grad();
  x64.set_requires_grad();
  struct Case {
    const char* name;
    Tensor (*fn)(const Tensor&);
  };
  for (Case c : {Case{"gelu", ops::gelu}, Case{"laplace", ops::laplace}, Case{"sigmoid", ops::sigmoid}}) {
    SCOPED_TRACE(c.name);
    Tensor y32 = c.fn(x32);  // each forward walked by its own backward (one tape per walk)
    autograd::backward(y32, Tensor::full({n}, 1.0, DType::f32));
    Tensor y64 = c.fn(x64);
    autograd::backward(y64, Tensor::full({n}, 1.0, DType::f64));
    auto a = y32.to_double_vector(), b = y64.to_double_vector();
    auto ga = x32.grad().to_double_vector(), gb = x64.grad().to_double_vector();
    for (int64_t i = 0; i < n; ++i) {
      // f32 rounding of the input alone moves the result by about |f'(x)·x|·6e−8
      ASSERT_NEAR(a[i], b[i], 1e-6 * (1 + std::abs(b[i]))) << "x = " << xs[i];
      ASSERT_NEAR(ga[i], gb[i], 2e-6 * (1 + std::abs(gb[i]) + std::abs(xs[i]))) << "derivative at x = " << xs[i];
    }
    x32.reset_grad();
    x64.reset_grad();
  }
}

TEST(NaNInputs, PropagateThroughSoftmaxAndTheFusedAttention) {
  // a NaN must reach the loss (training stops on it), not turn into a masked-looking zero
  const float nan = std::nanf("");
  Tensor row = Tensor::from_vector<float>({nan, nan, nan}, {1, 3});
  for (double v : ops::softmax(row).to_double_vector()) EXPECT_TRUE(std::isnan(v));
  Tensor q = Tensor::full({1, 1, 2, 4}, nan), k = Tensor::full({1, 1, 3, 4}, 0.5), v = Tensor::full({1, 1, 3, 4}, 1.0);
  for (double x : ops::flash_attention(q, k, v, Tensor()).to_double_vector()) EXPECT_TRUE(std::isnan(x));
  // a fully masked row is still zeros
  Tensor masked = ops::softmax(Tensor::from_vector<float>({1, 2, 3}, {1, 3}), Tensor::zeros({1, 3}));
  for (double x : masked.to_double_vector()) EXPECT_EQ(x, 0.0);
}

// ---------------------------------------------------------------- laid-out products
namespace {

struct LaidOutCase {
  ops::GemmShape s;
  bool ta, tb;
  MatrixLayout la, lb, lc;
  int64_t a_size, b_size, c_size;
};

// c[i] = alpha op(a[i]) op(b[i]) + beta c[i] element by element, each operand read where its
// layout says; every element of c outside its matrices keeps its value.
std::vector<double> laid_out_reference(const LaidOutCase& t, const std::vector<double>& a,
                                       const std::vector<double>& b, std::vector<double> c, double alpha,
                                       double beta) {
  const auto& s = t.s;
  for (int64_t i = 0; i < s.batch; ++i)
    for (int64_t r = 0; r < s.m; ++r)
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < s.k; ++p) {
          const double av = a[t.la.offset + i * t.la.stride + (t.ta ? p * t.la.ld + r : r * t.la.ld + p)];
          const double bv = b[t.lb.offset + i * t.lb.stride + (t.tb ? j * t.lb.ld + p : p * t.lb.ld + j)];
          sum += av * bv;
        }
        double& out = c[t.lc.offset + i * t.lc.stride + r * t.lc.ld + j];
        out = alpha * sum + beta * out;
      }
  return c;
}

// The layouts of the attention layer's projections and some that are not: heads of (B, H, N, d)
// with a weight's columns shared by the batch, a weight's rows, transposes, a lone matrix.
std::vector<LaidOutCase> laid_out_cases() {
  const int64_t B = 3, H = 2, N = 5, d = 3, D = 4;
  return {
      // y[:, h] = x w[:, h cols]: c heads, a batch rows, b columns (stride 0)
      {{B, N, d, D}, false, false, {0, D, N * D}, {1 * d, H * d, 0}, {1 * N * d, d, H * N * d}, B * N * D, D * H * d,
       B * H * N * d},
      // dx += dy[:, h] w[:, h cols]ᵀ
      {{B, N, D, d}, false, true, {0, d, H * N * d}, {d, H * d, 0}, {0, D, N * D}, B * H * N * d, D * H * d,
       B * N * D},
      // terms of dw[:, h] = x[b]ᵀ dy[b, h]
      {{B, D, d, N}, true, false, {0, D, N * D}, {N * d, d, H * N * d}, {d, H * d, D * H * d}, B * N * D,
       B * H * N * d, B * D * H * d},
      // both transposed, a lone matrix at an offset
      {{1, 4, 3, 2}, true, true, {5, 6, 0}, {2, 3, 0}, {7, 5, 0}, 5 + 2 * 6, 2 + 3 * 3, 7 + 4 * 5},
  };
}

void check_laid_out(const LaidOutCase& t, DType dt, Device device, double tol) {
  const Tensor a = Tensor::uniform({t.a_size}, 1, 0, -1.0, 1.0, dt), b = Tensor::uniform({t.b_size}, 2, 0, -1.0, 1.0, dt);
  const Tensor c0 = Tensor::uniform({t.c_size}, 3, 0, -1.0, 1.0, dt);
  for (double beta : {0.0, 1.0, 0.5}) {
    SCOPED_TRACE(fmt::format("m {} n {} k {} ta {} tb {} beta {} {}", t.s.m, t.s.n, t.s.k, t.ta, t.tb, beta,
                             device == Device::cpu ? "cpu" : "cuda"));
    Tensor c = c0.to(device).clone();
    ops::gemm_laid_out(c, t.lc, a.to(device), t.la, b.to(device), t.lb, t.ta, t.tb, 0.75, beta, t.s);
    const std::vector<double> want = laid_out_reference(t, a.to_double_vector(), b.to_double_vector(),
                                                        c0.to_double_vector(), 0.75, beta);
    const std::vector<double> got = c.to(Device::cpu).to_double_vector();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
  }
}

}  // namespace

TEST(LaidOutGemm, MatchesElementByElementProducts) {
  for (const LaidOutCase& t : laid_out_cases()) {
    check_laid_out(t, DType::f64, Device::cpu, 1e-12);
    check_laid_out(t, DType::f32, Device::cpu, 1e-5);
  }
}

TEST(LaidOutGemm, MatchesElementByElementProductsOnCuda) {
  SKIP_WITHOUT_GPU();
  for (const LaidOutCase& t : laid_out_cases()) check_laid_out(t, DType::f32, Device::cuda, 1e-5);
}

// A layout that would reach past its tensor, or results that overlap, are refused before any
// product runs.
TEST(LaidOutGemm, LayoutsOutsideTheirTensorsAreRefused) {
  Tensor a = Tensor::zeros({12}), b = Tensor::zeros({12}), c = Tensor::zeros({12});
  const ops::GemmShape s{2, 2, 2, 2};
  EXPECT_CAST_ERROR(ops::gemm_laid_out(c, {0, 2, 4}, a, {0, 2, 9}, b, {0, 2, 4}, false, false, 1.0, 0.0, s),
                    "matmul: a laid out with offset 0, rows 2 apart and matrices 9 apart reaches element 12");
  EXPECT_CAST_ERROR(ops::gemm_laid_out(c, {0, 2, 4}, a, {0, 2, 4}, b, {0, 1, 4}, false, false, 1.0, 0.0, s),
                    "cannot hold rows of 2");
  EXPECT_CAST_ERROR(ops::gemm_laid_out(c, {0, 2, 2}, a, {0, 2, 4}, b, {0, 2, 4}, false, false, 1.0, 0.0, s),
                    "the results laid out 2 apart overlap");
  EXPECT_NO_THROW(ops::gemm_laid_out(c, {0, 2, 4}, a, {0, 2, 4}, b, {0, 2, 0}, false, false, 1.0, 0.0, s));
}
