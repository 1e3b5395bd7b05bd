#include "cpu/gemm_tile.h"

#include <algorithm>
#include <vector>

namespace cast::ops {

static TileGemm g_tile_gemm = TileGemm::kernel;
void set_tile_gemm(TileGemm which) { g_tile_gemm = which; }
TileGemm tile_gemm() { return g_tile_gemm; }

namespace {

// One vector register of floats, in GCC's vector extension: the compiler emits the machine's
// own instructions (AVX-512, AVX2, or pairs of SSE registers in a portable build).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// Unaligned loads and stores of a Vec at p (compiled to one vector move each).
inline Vec load(const float* p) {
  Vec v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { __builtin_memcpy(p, &v, sizeof v); }

// 6 rows × 2 vectors: 12 accumulators, 2 registers of b and one broadcast of a fit in the 16
// registers of AVX2 (AVX-512 has 32, and the same shape keeps its two FMA ports busy).
constexpr int kRows = 6, kCols = 2 * kLanes;

// c(r, j) = alpha Σ_p a(r, p) · panel[p·ldp + j] + beta c(r, j) for r < Rows, j < cols ≤ kCols,
// with a(r, p) = a[r·rs + p·cs], panel kCols columns of op(b) (packed: ldp = kCols; or b itself,
// row-major, ldp = n), and c's rows ldc apart.
// A full-width panel is written from the registers; a narrower one (the last) through acc.
template <int Rows>
void microkernel(const float* a, int64_t rs, int64_t cs, const float* panel, int64_t ldp, int64_t k, float* c,
                 int64_t ldc, int64_t cols, float alpha, float beta) {
  Vec lo[Rows], hi[Rows];
  for (int r = 0; r < Rows; ++r) lo[r] = hi[r] = Vec{};
#pragma GCC unroll 2
  for (int64_t p = 0; p < k; ++p) {
    const Vec b_lo = load(panel + p * ldp), b_hi = load(panel + p * ldp + kLanes);
    const float* ap = a + p * cs;
#pragma GCC unroll 6
    for (int r = 0; r < Rows; ++r) {
      const float x = ap[r * rs];
      lo[r] += x * b_lo;
      hi[r] += x * b_hi;
    }
  }
  if (cols == kCols) {
    for (int r = 0; r < Rows; ++r) {
      float* out = c + r * ldc;
      if (beta == 0.0f) {  // c may hold anything (NaN included): it is not read
        store(out, alpha * lo[r]);
        store(out + kLanes, alpha * hi[r]);
      } else {
        store(out, alpha * lo[r] + beta * load(out));
        store(out + kLanes, alpha * hi[r] + beta * load(out + kLanes));
      }
    }
    return;
  }
  float acc[Rows * kCols];
  for (int r = 0; r < Rows; ++r) {
    store(acc + r * kCols, lo[r]);
    store(acc + r * kCols + kLanes, hi[r]);
  }
  for (int r = 0; r < Rows; ++r) {
    float* out = c + r * ldc;
    const float* in = acc + r * kCols;
    if (beta == 0.0f)
      for (int64_t j = 0; j < cols; ++j) out[j] = alpha * in[j];
    else
      for (int64_t j = 0; j < cols; ++j) out[j] = alpha * in[j] + beta * out[j];
  }
}

void run_microkernel(int rows, const float* a, int64_t rs, int64_t cs, const float* panel, int64_t ldp, int64_t k,
                     float* c, int64_t ldc, int64_t cols, float alpha, float beta) {
  switch (rows) {
    case 6: return microkernel<6>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
    case 5: return microkernel<5>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
    case 4: return microkernel<4>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
    case 3: return microkernel<3>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
    case 2: return microkernel<2>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
    default: return microkernel<1>(a, rs, cs, panel, ldp, k, c, ldc, cols, alpha, beta);
  }
}

}  // namespace

size_t packed_floats(int64_t n, int64_t k) {
  return static_cast<size_t>((n + kCols - 1) / kCols * kCols * std::max<int64_t>(k, 1));
}

// op(b) as column panels: panel q holds columns [q·kCols, (q+1)·kCols) for every p, kCols
// floats per p, zeros past n (their results are computed and not stored).
void pack_b(float* packed, const float* b, bool trans_b, int64_t n, int64_t k) {
  const int64_t panels = (n + kCols - 1) / kCols;
  for (int64_t q = 0; q < panels; ++q) {
    float* dst = packed + q * k * kCols;
    const int64_t j0 = q * kCols, cols = std::min<int64_t>(kCols, n - j0);
    if (trans_b) {  // b: (n, k); each row of b is read once along p
      if (cols < kCols)
        for (int64_t p = 0; p < k; ++p) std::fill(dst + p * kCols + cols, dst + (p + 1) * kCols, 0.0f);
      for (int64_t j = 0; j < cols; ++j) {
        const float* row = b + (j0 + j) * k;
        for (int64_t p = 0; p < k; ++p) dst[p * kCols + j] = row[p];
      }
    } else {  // b: (k, n)
      for (int64_t p = 0; p < k; ++p) {
        float* row = dst + p * kCols;
        std::copy(b + p * n + j0, b + p * n + j0 + cols, row);
        std::fill(row + cols, row + kCols, 0.0f);
      }
    }
  }
}

void gemm_tile_packed(float* c, const float* a, bool trans_a, const float* packed_b, float alpha, float beta, int64_t m,
                      int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  const int64_t rs = trans_a ? 1 : k, cs = trans_a ? m : 1;  // a(i, p) = a[i·rs + p·cs]
  const int64_t panels = (n + kCols - 1) / kCols;
  for (int64_t q = 0; q < panels; ++q) {
    const int64_t j0 = q * kCols, cols = std::min<int64_t>(kCols, n - j0);
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i0));
      run_microkernel(rows, a + i0 * rs, rs, cs, packed_b + q * k * kCols, kCols, k, c + i0 * n + j0, n, cols, alpha,
                      beta);
    }
  }
}

void gemm_tile_kernel(float* c, const float* a, const float* b, bool trans_a, bool trans_b, float alpha, float beta,
                      int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  thread_local std::vector<float> panels;  // this thread's, sized up once
  if (trans_b) {                           // op(b)'s columns are rows of b: packed first
    const size_t floats = packed_floats(n, k);
    if (panels.size() < floats) panels.resize(floats);
    pack_b(panels.data(), b, true, n, k);
    return gemm_tile_packed(c, a, trans_a, panels.data(), alpha, beta, m, n, k);
  }
  // b (k, n) row-major already holds every full panel, its rows n apart: read in place (the
  // copy cost a sixth of a 64 × 64 × 128 product); only a last, narrower panel is packed
  const int64_t rs = trans_a ? 1 : k, cs = trans_a ? m : 1;
  const int64_t full = n / kCols * kCols;
  for (int64_t j0 = 0; j0 < full; j0 += kCols)
    for (int64_t i0 = 0; i0 < m; i0 += kRows)
      run_microkernel(static_cast<int>(std::min<int64_t>(kRows, m - i0)), a + i0 * rs, rs, cs, b + j0, n, k,
                      c + i0 * n + j0, n, kCols, alpha, beta);
  if (full == n) return;
  const int64_t cols = n - full;
  if (panels.size() < packed_floats(cols, k)) panels.resize(packed_floats(cols, k));
  for (int64_t p = 0; p < k; ++p) {
    std::copy(b + p * n + full, b + p * n + n, panels.data() + p * kCols);
    std::fill(panels.data() + p * kCols + cols, panels.data() + (p + 1) * kCols, 0.0f);
  }
  for (int64_t i0 = 0; i0 < m; i0 += kRows)
    run_microkernel(static_cast<int>(std::min<int64_t>(kRows, m - i0)), a + i0 * rs, rs, cs, panels.data(), kCols, k,
                    c + i0 * n + full, n, cols, alpha, beta);
}

bool gemm_small_fits(int64_t m, int64_t n, int64_t k) {
  // rows for four tasks of 48 at least: with fewer (a weight gradient, 64 × 64 × N) the BLAS,
  // which splits the long k too, does better
  return m * n * k <= (int64_t{1} << 24) && m >= 192 && n <= 512 && k <= 2048;
}

void gemm_small(float* c, const float* a, const float* b, bool trans_a, bool trans_b, float alpha, float beta,
                int64_t batch, int64_t m, int64_t n, int64_t k) {
  if (batch == 0 || m == 0 || n == 0) return;
  const int64_t rs = trans_a ? 1 : k, cs = trans_a ? m : 1;  // a(i, p) = a[i·rs + p·cs]
  const int64_t panels = (n + kCols - 1) / kCols;
  constexpr int64_t kTaskRows = 8 * kRows;  // 48 rows of c per task
  const int64_t blocks = (m + kTaskRows - 1) / kTaskRows;
  const size_t per_batch = static_cast<size_t>(panels * kCols * std::max<int64_t>(k, 1));
  std::vector<float> packed(batch * per_batch);
#pragma omp parallel for schedule(static) if (batch > 1 && batch * n * k > 65536)
  for (int64_t bi = 0; bi < batch; ++bi)  // op(b) once for every row block
    pack_b(packed.data() + bi * per_batch, b + bi * k * n, trans_b, n, k);
#pragma omp parallel for schedule(static) if (batch * m * n * k > 65536)
  for (int64_t task = 0; task < batch * blocks; ++task) {
    const int64_t bi = task / blocks, r0 = task % blocks * kTaskRows, r1 = std::min(m, r0 + kTaskRows);
    const float* ab = a + bi * m * k;
    float* cb = c + bi * m * n;
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t j0 = q * kCols, cols = std::min<int64_t>(kCols, n - j0);
      for (int64_t i0 = r0; i0 < r1; i0 += kRows)
        run_microkernel(static_cast<int>(std::min<int64_t>(kRows, r1 - i0)), ab + i0 * rs, rs, cs,
                        packed.data() + bi * per_batch + q * k * kCols, kCols, k, cb + i0 * n + j0, n, cols, alpha,
                        beta);
    }
  }
}

}  // namespace cast::ops
