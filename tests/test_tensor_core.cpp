// The tensor-core instructions (cuda/tensor_core.cuh) and the flash kernels built on them
// (cuda/attention/full_attention_flash_tensor_core.cu), on the GPU or its emulation:
//   * each instruction shape against a plain product or copy, with the operands placed by the
//     PTX ISA's fragment layouts (cuda/tensor_core_check.cu);
//   * the conversions: round to nearest (even for BF16), NaN and infinities kept;
//   * every tensor-core flash kernel against the CPU's f64 flash attention on random shapes with
//     padding, output and every gradient, outputs poisoned and gradients prefilled first.
// Tolerances follow from the operand format, whose unit roundoff is u = 2^-p for p significant
// bits (BF16 8, TF32 11): a product's relative error is below 2u, and the attention outputs and
// gradients, sums of such products through a softmax, are held to 8u in norm (BF16 3.1e-2, TF32
// 3.9e-3). The split TF32 kernel (tf32x3) and the FMA kernel are held to 2e-5, FP32's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "ops/attention/full_attention_flash.h"
#include "tests/device_compare.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/full_attention_flash.h"
#include "cuda/runtime.h"
#include "cuda/tensor_core_check.h"
#endif

using namespace cast;
using namespace cast::testing;

#ifdef CAST_WITH_CUDA
namespace {

float rounded_tf32(float x) {  // to nearest, ties away from zero, 10 stored mantissa bits
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}
uint16_t bf16_bits(float x) {  // to nearest, ties to even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
float rounded_bf16(float x) { return bf16_value(bf16_bits(x)); }

// d = a b + c for each shape: TF32 m16n8k8 and BF16 m16n8k16, against the product of the rounded
// operands in double (the tensor core's products are exact; only the sum's rounding differs).
TEST(CudaVsCpuTensorCore, MmaMatchesAPlainProductOfTheRoundedOperands) {
  SKIP_WITHOUT_GPU();
  for (const int K : {8, 16}) {
    const Tensor a = Tensor::normal({16, K}, 11, K), b = Tensor::normal({K, 8}, 12, K),
                 c = Tensor::normal({16, 8}, 13, K);
    Tensor d = Tensor::full({16, 8}, std::nan(""), DType::f32, Device::cuda);
    const Tensor ag = a.to(Device::cuda), bg = b.to(Device::cuda), cg = c.to(Device::cuda);
    cuda::mma_check(d, ag, bg, cg);
    const std::vector<double> av = a.to_double_vector(), bv = b.to_double_vector(), cv = c.to_double_vector(),
                              dv = d.to_double_vector();
    const auto round = [&](double x) {
      return K == 8 ? rounded_tf32(static_cast<float>(x)) : rounded_bf16(static_cast<float>(x));
    };
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double want = cv[i * 8 + j], scale = std::abs(cv[i * 8 + j]);
        for (int k = 0; k < K; ++k) {
          want += round(av[i * K + k]) * round(bv[k * 8 + j]);
          scale += std::abs(round(av[i * K + k]) * round(bv[k * 8 + j]));
        }
        // the sum of K + 1 terms, rounded to FP32 in some order
        EXPECT_NEAR(dv[i * 8 + j], want, (K + 1) * 0x1p-24 * scale) << "k " << K << " at (" << i << ", " << j << ")";
      }
  }
}

// ldmatrix .x4: register m of lane (g, t) holds row g, elements 2t, 2t+1 of matrix m; with .trans
// elements (2t, g) and (2t+1, g). Every element distinct, so a misplaced one shows.
TEST(CudaVsCpuTensorCore, LdmatrixPlacesEveryElementByTheFragmentLayout) {
  SKIP_WITHOUT_GPU();
  std::vector<int32_t> words(32 * 8 / 2);
  for (int row = 0; row < 32; ++row)
    for (int e = 0; e < 8; e += 2) words[(row * 8 + e) / 2] = (row * 8 + e) | (row * 8 + e + 1) << 16;
  const Tensor in = Tensor::from_vector<int32_t>(words, {128}).to(Device::cuda);
  for (const bool trans : {false, true}) {
    Tensor out = Tensor::full({128}, -1, DType::i32, Device::cuda);
    cuda::ldmatrix_check(out, in, trans);
    const std::vector<double> got = out.to_double_vector();
    for (int lane = 0; lane < 32; ++lane)
      for (int m = 0; m < 4; ++m) {
        const int g = lane / 4, t = lane % 4;
        // element (r, c) of matrix m is the value 8 (8m + r) + c
        const auto value = [&](int r, int c) { return uint32_t(8 * (8 * m + r) + c); };
        const uint32_t want =
            trans ? value(2 * t, g) | value(2 * t + 1, g) << 16 : value(g, 2 * t) | value(g, 2 * t + 1) << 16;
        EXPECT_EQ(static_cast<uint32_t>(static_cast<int32_t>(got[4 * lane + m])), want)
            << (trans ? "trans " : "") << "lane " << lane << " register " << m;
      }
  }
}

// cp.async: 16 bytes per lane where asked, zeros where not; a group there once cp.async.wait_group
// leaves only newer ones pending, and a barrier follows.
TEST(CudaVsCpuTensorCore, CpAsyncCopiesOrZeroFills) {
  SKIP_WITHOUT_GPU();
  const Tensor src = Tensor::normal({128}, 21, 0).to(Device::cuda);
  std::vector<int32_t> valid(32);
  for (int l = 0; l < 32; ++l) valid[l] = l % 3 != 1;
  Tensor out = Tensor::full({256}, std::nan(""), DType::f32, Device::cuda);
  cuda::cp_async_check(out, src, Tensor::from_vector<int32_t>(valid, {32}).to(Device::cuda));
  const std::vector<double> got = out.to_double_vector(), want = src.to_double_vector();
  for (int i = 0; i < 256; ++i)
    EXPECT_EQ(got[i], valid[i % 128 / 4] ? want[i % 128] : 0.0)
        << (i < 128 ? "first group" : "second group") << ", element " << i % 128;
}

// The device's conversions: BF16 to nearest with ties to even, TF32 to nearest (ties away, as
// cvt.rna), infinities kept, NaN a NaN, a value past BF16's largest finite one an infinity.
TEST(CudaVsCpuTensorCore, ConversionsRoundToNearestAndKeepNaNAndInfinity) {
  SKIP_WITHOUT_GPU();
  std::vector<float> x = {1.0f,
                          -2.5f,
                          0.1f,
                          1.00390625f /* a BF16 tie: 1 + 2^-8 */,
                          1.01171875f /* tie, odd */,
                          3.0e38f,
                          3.4028235e38f /* FLT_MAX: past BF16's largest, 3.3895e38 */,
                          INFINITY,
                          -INFINITY,
                          std::nanf(""),
                          1e-40f,
                          -0.0f};
  for (int i = 0; i < 52; ++i) x.push_back(std::ldexp(1.0f + static_cast<float>(i) / 53.0f, i - 26));
  for (uint32_t tie : {0x3f801000u, 0x3f803000u, 0xbf801000u}) {  // TF32 ties: cvt.rna rounds them away from 0
    float f;
    std::memcpy(&f, &tie, 4);
    x.push_back(f);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor tf32 = Tensor::full({n}, 0, DType::i32, Device::cuda), bf16 = Tensor::full({n}, 0, DType::i32, Device::cuda);
  cuda::round_check(tf32, bf16, Tensor::from_vector<float>(x, {n}).to(Device::cuda));
  const std::vector<double> t = tf32.to_double_vector(), b = bf16.to_double_vector();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t tb = static_cast<uint32_t>(static_cast<int32_t>(t[i]));
    float tv;
    std::memcpy(&tv, &tb, 4);
    const float bv = bf16_value(static_cast<uint16_t>(b[i]));
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(tv) && std::isnan(bv)) << "NaN at " << i;
      continue;
    }
    EXPECT_EQ(bv, rounded_bf16(x[i])) << "bf16 of " << x[i];
    EXPECT_EQ(tv, rounded_tf32(x[i])) << "tf32 of " << x[i];
  }
  EXPECT_EQ(bf16_value(static_cast<uint16_t>(b[3])), 1.0f);          // the tie goes to the even 1.0
  EXPECT_EQ(bf16_value(static_cast<uint16_t>(b[4])), 1.015625f);     // and up to the even 1 + 4·2^-8
  EXPECT_TRUE(std::isinf(bf16_value(static_cast<uint16_t>(b[6]))));  // past the largest BF16
}

struct KernelTolerance {
  cuda::FlashKernel kernel;
  double tolerance;
};
const KernelTolerance kAllKernels[] = {{cuda::FlashKernel::fma, 2e-5},
                                       {cuda::FlashKernel::tf32x3, 2e-5},
                                       {cuda::FlashKernel::tf32, 8 * 0x1p-11},
                                       {cuda::FlashKernel::bf16, 8 * 0x1p-8}};

// The kernels against the CPU's f64 flash attention on (B, 2, M|N, d) with padding: a quarter of
// row 0's keys at the end, every third key of row 1, all of row 2's (a row with no real key).
void expect_kernels_match_reference(int64_t B, int64_t M, int64_t N, int64_t d,
                                    const std::vector<KernelTolerance>& kernels) {
  const int64_t H = 2;
  std::vector<float> m(B * N, 1.f);
  for (int64_t j = N - N / 4; j < N; ++j) m[j] = 0.f;
  if (B > 1)
    for (int64_t j = 0; j < N; j += 3) m[N + j] = 0.f;
  if (B > 2)
    for (int64_t j = 0; j < N; ++j) m[2 * N + j] = 0.f;
  const Tensor mask = Tensor::from_vector<float>(m, {B, N});
  const Tensor q = Tensor::normal({B, H, M, d}, 31, M), k = Tensor::normal({B, H, N, d}, 32, N),
               v = Tensor::normal({B, H, N, d}, 33, d), g = Tensor::normal({B, H, M, d}, 34, d);
  const Tensor pq = Tensor::uniform(q.shape(), 35, 0), pk = Tensor::uniform(k.shape(), 36, 0),
               pv = Tensor::uniform(v.shape(), 37, 0);  // gradients already there: the kernels add
  const auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  Tensor ro = Tensor::empty(q.shape(), DType::f64), rl = Tensor::empty({B, H, M}, DType::f64);
  ops::flash_attention_forward(ro, rl, f64(q), f64(k), f64(v), f64(mask));
  Tensor rdq = f64(pq), rdk = f64(pk), rdv = f64(pv);
  ops::flash_attention_backward(&rdq, &rdk, &rdv, f64(g), f64(q), f64(k), f64(v), f64(mask), ro, rl);
  const Tensor qc = q.to(Device::cuda), kc = k.to(Device::cuda), vc = v.to(Device::cuda), gc = g.to(Device::cuda),
               mc = mask.to(Device::cuda);
  for (const KernelTolerance& kernel : kernels) {
    const std::string what =
        fmt::format("{} at B {} M {} N {} d {} (runs {}, tiles {}x{}/{}x{})", cuda::flash_kernel_name(kernel.kernel), B,
                    M, N, d, cuda::flash_kernel_name(cuda::flash_kernel_that_runs(kernel.kernel, qc, kc, vc)),
                    cuda::flash_warp_rows(kernel.kernel, static_cast<int>(d)),
                    cuda::flash_stream_rows(kernel.kernel, static_cast<int>(d), true),
                    cuda::flash_backward_warp_rows(kernel.kernel, static_cast<int>(d)),
                    cuda::flash_stream_rows(kernel.kernel, static_cast<int>(d), false));
    Tensor out = Tensor::full(q.shape(), std::nan(""), DType::f32, Device::cuda);
    Tensor lse = Tensor::full({B, H, M}, std::nan(""), DType::f32, Device::cuda);
    cuda::flash_attention_forward(out, lse, qc, kc, vc, mc, kernel.kernel);
    Tensor dq = pq.to(Device::cuda), dk = pk.to(Device::cuda), dv = pv.to(Device::cuda);
    cuda::flash_attention_backward(&dq, &dk, &dv, gc, qc, kc, vc, mc, out, lse, kernel.kernel);
    EXPECT_LE(rel_diff(out, ro), kernel.tolerance) << "output, " << what;
    EXPECT_LE(rel_diff(lse, rl), kernel.tolerance) << "log-sum-exp, " << what;
    EXPECT_LE(rel_diff(difference(dq, pq), difference(rdq, pq)), kernel.tolerance) << "dq, " << what;
    EXPECT_LE(rel_diff(difference(dk, pk), difference(rdk, pk)), kernel.tolerance) << "dk, " << what;
    EXPECT_LE(rel_diff(difference(dv, pv), difference(rdv, pv)), kernel.tolerance) << "dv, " << what;
  }
}

// Runs the tensor-core backward as `backward` while it lives, then puts the engine's back.
struct WithBackward {
  cuda::FlashBackward before = cuda::flash_backward();
  explicit WithBackward(cuda::FlashBackward backward) { cuda::set_flash_backward(backward); }
  ~WithBackward() { cuda::set_flash_backward(before); }
};
constexpr cuda::FlashBackward kBackwards[] = {cuda::FlashBackward::split, cuda::FlashBackward::fused,
                                              cuda::FlashBackward::fused_atomic};
// the backwards whose sums are the same at every run (not fused_atomic's atomic adds)
constexpr cuda::FlashBackward kDeterministicBackwards[] = {cuda::FlashBackward::split, cuda::FlashBackward::fused};

}  // namespace

// Every tensor-core kernel against the CPU's f64 flash attention, with padding (a row of the
// batch with none real), several tiles, partial tiles and every head-width bound; the backward
// split in two kernels and fused in one (whose blocks add dQ in turn, or by atomic adds: 130 keys
// are three blocks of keys at 16 rows per warp).
TEST(CudaVsCpuTensorCore, FlashKernelsMatchTheF64Reference) {
  SKIP_WITHOUT_GPU();
  for (cuda::FlashBackward backward : kBackwards) {
    WithBackward with(backward);
    SCOPED_TRACE(cuda::flash_backward_name(backward));
    for (auto [B, M, N, d] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {3, 37, 45, 8}, {2, 70, 130, 16}, {1, 65, 33, 64}, {3, 33, 100, 128}, {1, 9, 40, 100}, {2, 20, 20, 12},
             {1, 65, 33, 48}}) {
      // at the default tiles the fused kernel is what runs when asked for, not the split pair
      for (const KernelTolerance& kernel : kAllKernels)
        EXPECT_EQ(cuda::flash_backward_runs_fused(kernel.kernel, static_cast<int>(d)),
                  backward != cuda::FlashBackward::split && kernel.kernel != cuda::FlashKernel::fma &&
                      !(kernel.kernel == cuda::FlashKernel::tf32x3 && d > 64))
            << cuda::flash_kernel_name(kernel.kernel) << " at d " << d;
      expect_kernels_match_reference(B, M, N, d, {std::begin(kAllKernels), std::end(kAllKernels)});
    }
  }
}

// The kernels each backward launches, by name: split runs the dQ kernel and the dK, dV kernel
// that leaves dQ alone; fused one dK, dV kernel whose blocks add dQ in turn; fused-atomic one
// whose blocks add it by atomic adds. Checked on every tensor-core kernel at a width where all
// three fit, so a dispatch that fell back to another variant (or a label that named the wrong
// one) fails here, not only in a benchmark's timing.
TEST(CudaVsCpuTensorCore, EachBackwardLaunchesItsOwnKernels) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 1, H = 2, M = 40, N = 70, d = 64;
  const Tensor q = Tensor::normal({B, H, M, d}, 41, 0).to(Device::cuda), k = Tensor::normal({B, H, N, d}, 42, 0).to(Device::cuda),
               v = Tensor::normal({B, H, N, d}, 43, 0).to(Device::cuda), g = Tensor::normal({B, H, M, d}, 44, 0).to(Device::cuda),
               mask = Tensor::full({B, N}, 1.0, DType::f32, Device::cuda);
  struct Logging {  // the log is switched off however the test ends
    std::vector<std::string> names;
    Logging() { cuda::set_launch_log(&names); }
    ~Logging() { cuda::set_launch_log(nullptr); }
    int64_t count(const std::string& name) const { return std::count(names.begin(), names.end(), name); }
  };
  for (cuda::FlashBackward backward : kBackwards) {
    WithBackward with(backward);
    for (const KernelTolerance& kernel : {kAllKernels[1], kAllKernels[2], kAllKernels[3]}) {
      const std::string what =
          fmt::format("{}, {}", cuda::flash_backward_name(backward), cuda::flash_kernel_name(kernel.kernel));
      Tensor out = Tensor::empty(q.shape(), DType::f32, Device::cuda), lse = Tensor::empty({B, H, M}, DType::f32, Device::cuda);
      cuda::flash_attention_forward(out, lse, q, k, v, mask, kernel.kernel);
      Tensor dq = Tensor::zeros(q.shape(), DType::f32, Device::cuda), dk = Tensor::zeros(k.shape(), DType::f32, Device::cuda),
             dv = Tensor::zeros(v.shape(), DType::f32, Device::cuda);
      Logging log;
      cuda::flash_attention_backward(&dq, &dk, &dv, g, q, k, v, mask, out, lse, kernel.kernel);
      const bool split = backward == cuda::FlashBackward::split;
      EXPECT_EQ(log.count("flash_tc_dq_kernel"), split ? 1 : 0) << what;
      EXPECT_EQ(log.count("flash_tc_dkdv_kernel<none>"), split ? 1 : 0) << what;
      EXPECT_EQ(log.count("flash_tc_dkdv_kernel<in_turn>"), backward == cuda::FlashBackward::fused ? 1 : 0) << what;
      EXPECT_EQ(log.count("flash_tc_dkdv_kernel<atomic>"), backward == cuda::FlashBackward::fused_atomic ? 1 : 0)
          << what;
    }
  }
}

// The same at every tile the benchmarks may choose (cast bench flash --stream-rows, --warp-rows):
// 150 rows are a block of 128 and a partial one at 32 rows per warp, in the forward and the
// backward; at width 32 the backward keeps 32 rows per warp with 64 streamed rows too (the split
// kernel's pair rows among them, which at width 128 leave it to the FMA kernel).
TEST(CudaVsCpuTensorCore, FlashKernelsMatchAtEveryStreamedTile) {
  SKIP_WITHOUT_GPU();
  for (cuda::FlashBackward backward : kBackwards)
  for (int warp_rows : {16, 32})
    for (int rows : {32, 64, 128}) {
      WithBackward with(backward);
      SCOPED_TRACE(cuda::flash_backward_name(backward));
      cuda::set_flash_stream_rows(rows);
      cuda::set_flash_warp_rows(warp_rows);
      expect_kernels_match_reference(2, 150, 150, 64, {kAllKernels[1], kAllKernels[2], kAllKernels[3]});
      expect_kernels_match_reference(3, 140, 75, 32, {kAllKernels[1], kAllKernels[2], kAllKernels[3]});
      if (warp_rows == 16) expect_kernels_match_reference(1, 33, 100, 128, {kAllKernels[3]});
    }
  cuda::set_flash_stream_rows(0);
  cuda::set_flash_warp_rows(0);
}

// The split kernel with one buffer of streamed tiles (each tile's copy waited for before it is
// multiplied) at every tile, as the benchmarks may choose it (cast bench flash --copy-stages).
TEST(CudaVsCpuTensorCore, SplitKernelMatchesWithOneBufferOfStreamedTiles) {
  SKIP_WITHOUT_GPU();
  struct Stages {  // put back however the test ends
    Stages() { cuda::set_flash_copy_stages(1); }
    ~Stages() {
      cuda::set_flash_copy_stages(0);
      cuda::set_flash_stream_rows(0);
      cuda::set_flash_warp_rows(0);
    }
  } stages;
  for (cuda::FlashBackward backward : kBackwards)
    for (int warp_rows : {16, 32})
      for (int rows : {32, 64, 128}) {
        WithBackward with(backward);
        SCOPED_TRACE(
            fmt::format("{}, {} rows per warp, {} streamed", cuda::flash_backward_name(backward), warp_rows, rows));
        cuda::set_flash_stream_rows(rows);
        cuda::set_flash_warp_rows(warp_rows);
        ASSERT_EQ(cuda::flash_copy_stages(cuda::FlashKernel::tf32x3, 64, false), 1);
        expect_kernels_match_reference(2, 150, 150, 64, {kAllKernels[1]});
        expect_kernels_match_reference(3, 140, 75, 32, {kAllKernels[1]});
      }
}

// A GPU whose blocks get less shared memory than a kernel's tiles need (sm_86 and sm_89: 99 KiB)
// runs the FMA kernel instead: the split kernel's pair rows at width 64 take 132 KiB; BF16's tiles
// fit, and run.
TEST(CudaVsCpuTensorCore, TilesBeyondTheSharedMemoryFallBackToTheFmaKernel) {
  SKIP_WITHOUT_GPU();
  struct Limit {  // put back however the test ends
    Limit() { cuda::set_flash_shared_limit(101376); }
    ~Limit() { cuda::set_flash_shared_limit(0); }
  } limit;
  const Tensor q = Tensor::normal({1, 2, 40, 64}, 71, 0).to(Device::cuda);
  EXPECT_FALSE(cuda::flash_tc_fits(cuda::FlashKernel::tf32x3, 64));
  EXPECT_EQ(cuda::flash_kernel_that_runs(cuda::FlashKernel::tf32x3, q, q, q), cuda::FlashKernel::fma);
  EXPECT_TRUE(cuda::flash_tc_fits(cuda::FlashKernel::bf16, 64));
  EXPECT_EQ(cuda::flash_kernel_that_runs(cuda::FlashKernel::bf16, q, q, q), cuda::FlashKernel::bf16);
  expect_kernels_match_reference(1, 40, 70, 64, {std::begin(kAllKernels), std::end(kAllKernels)});
  cuda::set_flash_shared_limit(0);
  EXPECT_TRUE(cuda::flash_tc_fits(cuda::FlashKernel::tf32x3, 64));  // 227 KiB (sm_90, and the emulation)
}

// More batch-heads than one launch takes (65535 on a GPU; CAST's clusters at batch 256 are
// 65536): the kernels run in several launches of whole batch rows, each a smaller batch with
// its rows of the mask. The limit is lowered to 3 here: a launch takes one batch row of 2 heads,
// so 3 rows (each with a different mask) take three launches.
TEST(CudaVsCpuTensorCore, FlashKernelsSplitBatchHeadsOverLaunches) {
  SKIP_WITHOUT_GPU();
  struct Limit {  // put back however the test ends
    Limit() { cuda::set_flash_grid_y_limit(3); }
    ~Limit() { cuda::set_flash_grid_y_limit(65535); }
  } limit;
  for (cuda::FlashBackward backward : kBackwards) {
    WithBackward with(backward);
    SCOPED_TRACE(cuda::flash_backward_name(backward));
    expect_kernels_match_reference(3, 37, 45, 8, {std::begin(kAllKernels), std::end(kAllKernels)});
    expect_kernels_match_reference(3, 20, 70, 64, {kAllKernels[0], kAllKernels[3]});
  }
}

// The split-TF32 kernel keeps FP32's accuracy over a long sequence, at widths 32 and 64 (the Text
// preset's): each of its errors against f64 is at most twice the FMA kernel's (on the GPU it
// measured below it at width 32, bench/RESULTS.md; the emulation's model is more pessimistic).
// A kernel that carries its running sums through the tensor core's accumulator, which cuts low
// bits off at every k-step (the emulation models that), fails here: four times the FMA error
// at N 256 and fifteen at N 1024.
TEST(CudaVsCpuTensorCore, FlashSplitKernelKeepsTheFmaKernelsAccuracy) {
  SKIP_WITHOUT_GPU();
  for (const int64_t d : {32, 64}) {
    SCOPED_TRACE(fmt::format("width {}", d));
    const int64_t N = 256;
    std::vector<float> m(N, 1.f);
    for (int64_t j = N - N / 4; j < N; ++j) m[j] = 0.f;
    const Tensor mask = Tensor::from_vector<float>(m, {1, N});
    const Tensor q = Tensor::normal({1, 1, N, d}, 61, 0), k = Tensor::normal({1, 1, N, d}, 62, 0),
                 v = Tensor::normal({1, 1, N, d}, 63, 0), g = Tensor::normal({1, 1, N, d}, 64, 0);
    const auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
    Tensor ro = Tensor::empty(q.shape(), DType::f64), rl = Tensor::empty({1, 1, N}, DType::f64);
    ops::flash_attention_forward(ro, rl, f64(q), f64(k), f64(v), f64(mask));
    Tensor rdq = Tensor::zeros(q.shape(), DType::f64), rdk = Tensor::zeros(k.shape(), DType::f64),
           rdv = Tensor::zeros(v.shape(), DType::f64);
    ops::flash_attention_backward(&rdq, &rdk, &rdv, f64(g), f64(q), f64(k), f64(v), f64(mask), ro, rl);
    const auto errors = [&](cuda::FlashKernel kernel) {
      const Tensor qc = q.to(Device::cuda), kc = k.to(Device::cuda), vc = v.to(Device::cuda);
      Tensor out = Tensor::empty(q.shape(), DType::f32, Device::cuda), lse = Tensor::empty({1, 1, N}, DType::f32, Device::cuda);
      cuda::flash_attention_forward(out, lse, qc, kc, vc, mask.to(Device::cuda), kernel);
      Tensor dq = Tensor::zeros(q.shape(), DType::f32, Device::cuda), dk = Tensor::zeros(k.shape(), DType::f32, Device::cuda),
             dv = Tensor::zeros(v.shape(), DType::f32, Device::cuda);
      cuda::flash_attention_backward(&dq, &dk, &dv, g.to(Device::cuda), qc, kc, vc, mask.to(Device::cuda), out, lse,
                                     kernel);
      return std::vector<double>{rel_diff(out, ro), rel_diff(dq, rdq), rel_diff(dk, rdk), rel_diff(dv, rdv)};
    };
    const std::vector<double> fma = errors(cuda::FlashKernel::fma), split = errors(cuda::FlashKernel::tf32x3);
    const char* names[] = {"output", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      EXPECT_GT(fma[i], 0.0) << names[i];  // a rounding error to compare with
      EXPECT_LE(split[i], 2 * fma[i]) << names[i] << ": split TF32 " << split[i] << ", FMA " << fma[i];
    }
  }
}

// The NaN rule (math/softmax_rule.h) in every flash kernel, with tiles of padding and tiles
// without (which take the tensor-core kernels' unmasked path): NaN in a query, a real key, a
// padding key's K or V, or an output gradient reaches exactly the outputs and gradients it
// reaches in the CPU's f64 flash attention.
TEST(CudaVsCpuTensorCore, FlashKernelsKeepTheNaNRule) {
  SKIP_WITHOUT_GPU();
  const int64_t B = 2, H = 2, M = 70, N = 150, d = 32;
  std::vector<float> m(B * N, 1.f);
  for (int64_t j = 130; j < N; ++j) m[j] = 0.f;  // batch row 0: a padded last tile; row 1: none padded
  const Tensor mask = Tensor::from_vector<float>(m, {B, N});
  const auto with_nan = [](Tensor t, std::vector<int64_t> at) {
    std::vector<double> x = t.to_double_vector();
    for (int64_t i : at) x[i] = std::nan("");
    return Tensor::from_vector<double>(x, t.shape()).to(DType::f32);
  };
  const auto at = [&](int64_t b, int64_t h, int64_t rows, int64_t row) { return ((b * H + h) * rows + row) * d; };
  // q: (1, 1) query 5; k: (0, 1) padding key 140 and (1, 0) real key 70; v: (0, 0) padding key
  // 135; dO: (1, 1) query 66
  const Tensor q = with_nan(Tensor::normal({B, H, M, d}, 51, 0), {at(1, 1, M, 5) + 3}),
               k = with_nan(Tensor::normal({B, H, N, d}, 52, 0), {at(0, 1, N, 140), at(1, 0, N, 70) + 7}),
               v = with_nan(Tensor::normal({B, H, N, d}, 53, 0), {at(0, 0, N, 135) + 1}),
               g = with_nan(Tensor::normal({B, H, M, d}, 54, 0), {at(1, 1, M, 66) + 2});
  const auto f64 = [](const Tensor& t) { return t.to(DType::f64); };
  Tensor ro = Tensor::empty(q.shape(), DType::f64), rl = Tensor::empty({B, H, M}, DType::f64);
  ops::flash_attention_forward(ro, rl, f64(q), f64(k), f64(v), f64(mask));
  Tensor rdq = Tensor::zeros(q.shape(), DType::f64), rdk = Tensor::zeros(k.shape(), DType::f64),
         rdv = Tensor::zeros(v.shape(), DType::f64);
  ops::flash_attention_backward(&rdq, &rdk, &rdv, f64(g), f64(q), f64(k), f64(v), f64(mask), ro, rl);
  const auto nans = [](const Tensor& t) {
    std::vector<bool> p;
    for (double x : t.to_double_vector()) p.push_back(std::isnan(x));
    return p;
  };
  const Tensor qc = q.to(Device::cuda), kc = k.to(Device::cuda), vc = v.to(Device::cuda), gc = g.to(Device::cuda),
               mc = mask.to(Device::cuda);
  for (cuda::FlashBackward backward : kBackwards)
  for (const KernelTolerance& kernel : kAllKernels) {
    WithBackward with(backward);
    SCOPED_TRACE(cuda::flash_backward_name(backward));
    Tensor out = Tensor::full(q.shape(), 7.0, DType::f32, Device::cuda),
           lse = Tensor::full({B, H, M}, 7.0, DType::f32, Device::cuda);
    cuda::flash_attention_forward(out, lse, qc, kc, vc, mc, kernel.kernel);
    Tensor dq = Tensor::zeros(q.shape(), DType::f32, Device::cuda),
           dk = Tensor::zeros(k.shape(), DType::f32, Device::cuda),
           dv = Tensor::zeros(v.shape(), DType::f32, Device::cuda);
    cuda::flash_attention_backward(&dq, &dk, &dv, gc, qc, kc, vc, mc, out, lse, kernel.kernel);
    const char* name = cuda::flash_kernel_name(kernel.kernel);
    EXPECT_EQ(nans(out), nans(ro)) << "output, " << name;
    EXPECT_EQ(nans(lse), nans(rl)) << "log-sum-exp, " << name;
    EXPECT_EQ(nans(dq), nans(rdq)) << "dq, " << name;
    EXPECT_EQ(nans(dk), nans(rdk)) << "dk, " << name;
    EXPECT_EQ(nans(dv), nans(rdv)) << "dv, " << name;
  }
  // the case says something: the query's NaN reaches its own output row alone, and a padding
  // key's NaN K no output
  const std::vector<bool> o = nans(ro);
  EXPECT_TRUE(o[at(1, 1, M, 5)]);
  EXPECT_FALSE(o[at(1, 1, M, 6)]);
  EXPECT_FALSE(o[at(0, 1, M, 6)]);
}

// The backward gives the same bits every time: no atomics, a fixed order of sums (the fused
// backward's blocks add dQ in turn: 600 keys are five blocks of 128 keys or ten of 64).
TEST(CudaVsCpuTensorCore, FlashBackwardIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const Tensor q = Tensor::normal({1, 2, 70, 64}, 41, 0).to(Device::cuda),
               k = Tensor::normal({1, 2, 600, 64}, 42, 0).to(Device::cuda),
               v = Tensor::normal({1, 2, 600, 64}, 43, 0).to(Device::cuda),
               g = Tensor::normal({1, 2, 70, 64}, 44, 0).to(Device::cuda);
  for (cuda::FlashBackward backward : kDeterministicBackwards)
  for (cuda::FlashKernel kernel : {cuda::FlashKernel::tf32, cuda::FlashKernel::bf16}) {
    WithBackward with(backward);
    std::vector<std::vector<double>> runs;
    for (int r = 0; r < 2; ++r) {
      Tensor out = Tensor::empty(q.shape(), DType::f32, Device::cuda),
             lse = Tensor::empty({1, 2, 70}, DType::f32, Device::cuda);
      cuda::flash_attention_forward(out, lse, q, k, v, Tensor(), kernel);
      Tensor dq = Tensor::zeros(q.shape(), DType::f32, Device::cuda),
             dk = Tensor::zeros(k.shape(), DType::f32, Device::cuda),
             dv = Tensor::zeros(v.shape(), DType::f32, Device::cuda);
      cuda::flash_attention_backward(&dq, &dk, &dv, g, q, k, v, Tensor(), out, lse, kernel);
      std::vector<double> all;
      for (const Tensor& t : {out, dq, dk, dv})
        for (double x : t.to_double_vector()) all.push_back(x);
      runs.push_back(all);
    }
    EXPECT_EQ(runs[0], runs[1]) << cuda::flash_kernel_name(kernel) << ", " << cuda::flash_backward_name(backward);
  }
}
#endif
