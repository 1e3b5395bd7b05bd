#include "ops/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/convert.h"
#include "ops/layout.h"
#ifdef CAST_WITH_CUDA
#include "cuda/matmul.h"
#endif

namespace cast::ops {

static CpuGemm g_cpu_gemm = CpuGemm::blas;
void set_cpu_gemm(CpuGemm which) { g_cpu_gemm = which; }
CpuGemm cpu_gemm() { return g_cpu_gemm; }

// ---------------------------------------------------------------- CPU reference kernel
// The readable version: plain loops, blocked for the cache. The BLAS path below is tested
// against it (tests/test_ops_values.cpp).
// Row-major copy of op(x) for one batch element, so the inner loop always streams rows.
template <class T>
static const T* as_row_major(const T* x, int64_t rows, int64_t cols, bool transposed, std::vector<T>& scratch) {
  if (!transposed) return x;  // already (rows, cols)
  scratch.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) scratch[r * cols + c] = x[c * rows + r];
  return scratch.data();
}

// Cache-blocked C = alpha A B + beta C for row-major A (M,K), B (K,N): the innermost loop runs
// along a row of B and C, which the compiler vectorises; blocks keep B's panel in cache.
template <class T>
static void gemm_block_cpu(T* c, const T* a, const T* b, int64_t n, int64_t k, T alpha, T beta, int64_t i0,
                           int64_t i1) {
  constexpr int64_t kBlockK = 128, kBlockN = 512;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = 0; j < n; ++j) c[i * n + j] = beta == T(0) ? T(0) : beta * c[i * n + j];
  for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
    const int64_t j1 = std::min(n, j0 + kBlockN);
    for (int64_t p0 = 0; p0 < k; p0 += kBlockK) {
      const int64_t p1 = std::min(k, p0 + kBlockK);
      for (int64_t i = i0; i < i1; ++i) {
        T* crow = c + i * n;
        for (int64_t p = p0; p < p1; ++p) {
          const T aip = alpha * a[i * k + p];
          const T* brow = b + p * n;
          CAST_OMP("omp simd")
          for (int64_t j = j0; j < j1; ++j) crow[j] += aip * brow[j];
        }
      }
    }
  }
}

template <class T>
void gemm_loops(T* c, const T* a, const T* b, bool ta, bool tb, T alpha, T beta, const GemmShape& s) {
  constexpr int64_t kBlockM = 32;
  const int64_t row_blocks = (s.m + kBlockM - 1) / kBlockM;
  // Threads only pay off beyond a few tens of thousands of multiply-adds.
  const bool parallel = s.batch * s.m * s.n * s.k > 32768;
#pragma omp parallel if (parallel)
  {
    std::vector<T> scratch_a, scratch_b;
    int64_t packed_batch = -1;
    const T *pa = nullptr, *pb = nullptr;
#pragma omp for schedule(static)
    for (int64_t job = 0; job < s.batch * row_blocks; ++job) {
      const int64_t bi = job / row_blocks, rb = job % row_blocks;
      if (bi != packed_batch) {  // pack this batch element's operands once per thread
        pa = as_row_major(a + bi * s.m * s.k, s.m, s.k, ta, scratch_a);
        pb = as_row_major(b + bi * s.k * s.n, s.k, s.n, tb, scratch_b);
        packed_batch = bi;
      }
      gemm_block_cpu(c + bi * s.m * s.n, pa, pb, s.n, s.k, alpha, beta, rb * kBlockM,
                     std::min(s.m, (rb + 1) * kBlockM));
    }
  }
}

template void gemm_loops<float>(float*, const float*, const float*, bool, bool, float, float, const GemmShape&);
template void gemm_loops<double>(double*, const double*, const double*, bool, bool, double, double, const GemmShape&);

// ---------------------------------------------------------------- CPU BLAS kernel
// One row-major product with the rows of each operand ld apart (packed when ld = 0).
static void blas_call(float* c, const float* a, const float* b, bool ta, bool tb, float alpha, float beta, int m, int n,
                      int k, int lda = 0, int ldb = 0, int ldc = 0) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda ? lda : std::max(1, ta ? m : k), b, ldb ? ldb : std::max(1, tb ? k : n), beta, c,
              ldc ? ldc : std::max(1, n));
}
static void blas_call(double* c, const double* a, const double* b, bool ta, bool tb, double alpha, double beta, int m,
                      int n, int k, int lda = 0, int ldb = 0, int ldc = 0) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda ? lda : std::max(1, ta ? m : k), b, ldb ? ldb : std::max(1, tb ? k : n), beta, c,
              ldc ? ldc : std::max(1, n));
}

template <class T>
void gemm_blas(T* c, const T* a, const T* b, bool ta, bool tb, T alpha, T beta, const GemmShape& s) {
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // no products: c = beta c (a BLAS would be handed a leading dimension of 0)
    for (int64_t i = 0; i < s.batch * s.m * s.n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
    return;
  }
  CAST_CHECK(s.m <= INT32_MAX && s.n <= INT32_MAX && s.k <= INT32_MAX, "matmul: {}x{}x{} exceeds the BLAS's int sizes",
             s.m, s.n, s.k);
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  auto one = [&](int64_t bi) {
    blas_call(c + bi * s.m * s.n, a + bi * s.m * s.k, b + bi * s.k * s.n, ta, tb, alpha, beta, m, n, k);
  };
  // Many small products (attention heads, clusters): one product per thread, each BLAS call
  // single-threaded (OpenBLAS's OpenMP build runs on the caller inside a parallel region).
  // One big product: the BLAS threads it.
  const bool small = s.m * s.n * s.k < (int64_t{1} << 21);
  if (s.batch > 1 && small) {
#pragma omp parallel for schedule(dynamic, 1) if (s.batch * s.m * s.n * s.k > 32768)
    for (int64_t bi = 0; bi < s.batch; ++bi) one(bi);
  } else {
    for (int64_t bi = 0; bi < s.batch; ++bi) one(bi);
  }
}
template void gemm_blas<float>(float*, const float*, const float*, bool, bool, float, float, const GemmShape&);
template void gemm_blas<double>(double*, const double*, const double*, bool, bool, double, double, const GemmShape&);

void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha, double beta,
          const GemmShape& s) {
  CAST_ON_CUDA(c, cuda::gemm(c, a, b, ta, tb, alpha, beta, s.batch, s.m, s.n, s.k, current_precision()));
  if (c.dtype() == DType::f32 && g_cpu_gemm == CpuGemm::blas && tile_gemm() == TileGemm::kernel &&
      gemm_small_fits(s.m, s.n, s.k))
    return gemm_small(c.data<float>(), a.data<float>(), b.data<float>(), ta, tb, static_cast<float>(alpha),
                      static_cast<float>(beta), s.batch, s.m, s.n, s.k);
  CAST_DISPATCH_FLOAT(c.dtype(), "matmul", [&] {
    auto kernel = g_cpu_gemm == CpuGemm::blas ? gemm_blas<T> : gemm_loops<T>;
    kernel(c.data<T>(), a.data<T>(), b.data<T>(), ta, tb, static_cast<T>(alpha), static_cast<T>(beta), s);
  });
}

void gemm_sum_over_batch(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha) {
  CAST_CHECK(a.ndim() >= 3 && b.ndim() == a.ndim() && a.dim(0) == b.dim(0),
             "matmul: a batch sum needs operands with one leading dim more than the result, got {} and {}",
             a.describe(), b.describe());
  if (c.is_cuda()) {
    Shape terms = c.shape();
    terms.insert(terms.begin(), a.dim(0));
    Tensor parts = Tensor::empty(terms, c.dtype(), c.device());
    gemm(parts, a, b, ta, tb, alpha, 0.0, matmul_shape(a, b, ta, tb));
    add_into(c, sum_to_shape(parts, c.shape()));
    return;
  }
  for (int64_t i = 0; i < a.dim(0); ++i) {
    const Tensor ai = a.slice0(i), bi = b.slice0(i);
    gemm(c, ai, bi, ta, tb, alpha, 1.0, matmul_shape(ai, bi, ta, tb));
  }
}

// ---------------------------------------------------------------- laid-out products
namespace {

// A layout of `batch` matrices of rows × cols stays inside t's elements.
void check_layout(const char* name, const Tensor& t, const MatrixLayout& l, int64_t batch, int64_t rows,
                  int64_t cols) {
  CAST_CHECK(l.offset >= 0 && l.stride >= 0 && l.ld >= std::max<int64_t>(1, cols) && l.ld <= INT32_MAX,
             "matmul: {} laid out with offset {}, rows {} apart and matrices {} apart cannot hold rows of {}", name,
             l.offset, l.ld, l.stride, cols);
  if (batch == 0 || rows == 0 || cols == 0) return;
  const int64_t last = l.offset + (batch - 1) * l.stride + (rows - 1) * l.ld + cols - 1;
  CAST_CHECK(last < t.numel(), "matmul: {} laid out with offset {}, rows {} apart and matrices {} apart reaches "
             "element {} of {}, which has {}", name, l.offset, l.ld, l.stride, last, t.describe(), t.numel());
}

// An operand has c's dtype, or is BF16 for an FP32 c where the products take BF16 operands: on
// CUDA at --precision bf16 (a BF16 copy made once for several products).
void check_operand_dtype(const char* name, const Tensor& x, const Tensor& c) {
  if (x.dtype() != DType::bf16) return check_same_dtype("matmul", x, c);
  CAST_CHECK(c.dtype() == DType::f32 && products_take_bf16(c),
             "matmul: a BF16 operand {} ({}) is read only by products into f32 on CUDA at --precision bf16, not into "
             "{} at {}", name, x.describe(), c.describe(), precision_name(current_precision()));
}

template <class T>
void gemm_laid_out_cpu(T* c, const MatrixLayout& lc, const T* a, const MatrixLayout& la, const T* b,
                       const MatrixLayout& lb, bool ta, bool tb, T alpha, T beta, const GemmShape& s) {
  if (s.k == 0) {  // no products: c = beta c, row by row (a BLAS would be handed an empty inner size)
    for (int64_t bi = 0; bi < s.batch; ++bi)
      for (int64_t r = 0; r < s.m; ++r) {
        T* row = c + lc.offset + bi * lc.stride + r * lc.ld;
        for (int64_t j = 0; j < s.n; ++j) row[j] = beta == T(0) ? T(0) : beta * row[j];
      }
    return;
  }
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  for (int64_t bi = 0; bi < s.batch; ++bi)  // each product threaded by the BLAS
    blas_call(c + lc.offset + bi * lc.stride, a + la.offset + bi * la.stride, b + lb.offset + bi * lb.stride, ta, tb,
              alpha, beta, m, n, k, static_cast<int>(la.ld), static_cast<int>(lb.ld), static_cast<int>(lc.ld));
}

}  // namespace

void gemm_laid_out(Tensor& c, const MatrixLayout& lc, const Tensor& a, const MatrixLayout& la, const Tensor& b,
                   const MatrixLayout& lb, bool ta, bool tb, double alpha, double beta, const GemmShape& s) {
  check_float("matmul", c, "c");
  check_operand_dtype("a", a, c);
  check_operand_dtype("b", b, c);
  check_same_device("matmul", a, c);
  check_same_device("matmul", b, c);
  CAST_CHECK(s.batch >= 0 && s.m >= 0 && s.n >= 0 && s.k >= 0 && s.m <= INT32_MAX && s.n <= INT32_MAX &&
                 s.k <= INT32_MAX,
             "matmul: a laid-out product of {} × {} × {} (batch {}) is beyond the BLAS's int sizes", s.m, s.n, s.k,
             s.batch);
  check_layout("a", a, la, s.batch, ta ? s.k : s.m, ta ? s.m : s.k);
  check_layout("b", b, lb, s.batch, tb ? s.n : s.k, tb ? s.k : s.n);
  check_layout("c", c, lc, s.batch, s.m, s.n);
  // the products run side by side: two of them writing one element would race
  CAST_CHECK(s.batch <= 1 || s.m == 0 || lc.stride >= s.m * lc.ld,
             "matmul: the results laid out {} apart overlap (each spans {} rows {} apart)", lc.stride, s.m, lc.ld);
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  CAST_ON_CUDA(c, cuda::gemm_laid_out(c, lc, a, la, b, lb, ta, tb, alpha, beta, s.batch, s.m, s.n, s.k,
                                      current_precision()));
  CAST_DISPATCH_FLOAT(c.dtype(), "matmul", [&] {
    gemm_laid_out_cpu<T>(c.data<T>(), lc, a.data<T>(), la, b.data<T>(), lb, ta, tb, static_cast<T>(alpha),
                         static_cast<T>(beta), s);
  });
}

bool products_take_bf16(const Tensor& x) {
  return x.is_cuda() && current_precision() == Precision::bf16 && bf16_gemm() == Bf16Gemm::bf16_operands;
}

void check_operand_pair(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name) {
  const bool a16 = a.defined() && a.dtype() == DType::bf16, b16 = b.defined() && b.dtype() == DType::bf16;
  if (!a16 && !b16) {
    check_float(op, a, a_name);
    check_float(op, b, b_name);
    return check_same_dtype(op, a, b);
  }
  const Tensor& x = a16 ? a : b;  // a BF16 one
  const Tensor& other = a16 ? b : a;
  CAST_CHECK(products_take_bf16(x), "{}: a BF16 operand {} ({}) is read only by products on CUDA at --precision bf16, "
             "not on {} at {}", op, a16 ? a_name : b_name, x.describe(), device_name(x.device()),
             precision_name(current_precision()));
  CAST_CHECK(other.defined() && (other.dtype() == DType::f32 || other.dtype() == DType::bf16),
             "{}: a BF16 operand {} is read beside f32 or BF16 ones, not beside {}", op, a16 ? a_name : b_name,
             other.describe());
}

Tensor as_product_operand(const Tensor& x) {
  if (!products_take_bf16(x) || x.dtype() != DType::f32) return x;
  Tensor copy = Tensor::empty(x.shape(), DType::bf16, x.device());
  convert_forward(copy, x);
  return copy;
}

// ---------------------------------------------------------------- shapes
GemmShape matmul_shape(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_operand_pair("matmul", a, "a", b, "b");
  check_same_device("matmul", a, b);
  CAST_CHECK(a.ndim() >= 2 && b.ndim() >= 2, "matmul: operands need 2+ dims, got {} and {}", a.describe(),
             b.describe());
  CAST_CHECK(a.ndim() == b.ndim(), "matmul: batch dims of {} and {} differ (a 2-D b is folded by matmul())",
             a.describe(), b.describe());
  GemmShape s;
  for (int d = 0; d < a.ndim() - 2; ++d) {
    CAST_CHECK(a.shape()[d] == b.shape()[d], "matmul: batch dims of {} and {} differ", a.describe(), b.describe());
    s.batch *= a.shape()[d];
  }
  s.m = ta ? a.dim(-1) : a.dim(-2);
  s.k = ta ? a.dim(-2) : a.dim(-1);
  int64_t kb = tb ? b.dim(-1) : b.dim(-2);
  s.n = tb ? b.dim(-2) : b.dim(-1);
  CAST_CHECK(s.k == kb, "matmul: inner dims differ: {}{} times {}{}", a.describe(), ta ? "ᵀ" : "", b.describe(),
             tb ? "ᵀ" : "");
  return s;
}

void matmul_forward(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  GemmShape s = matmul_shape(a, b, ta, tb);
  CAST_CHECK(c.numel() == s.batch * s.m * s.n, "matmul: output {} has the wrong size", c.describe());
  gemm(c, a, b, ta, tb, 1.0, 0.0, s);
}

void matmul_backward(Tensor* da, Tensor* db, const Tensor& dc, const Tensor& a, const Tensor& b, bool ta, bool tb,
                     double beta_a, double beta_b) {
  GemmShape s = matmul_shape(a, b, ta, tb);
  // both products read dc: where they take BF16 it is rounded once, not once by each
  const Tensor dc_read = da && db ? as_product_operand(dc) : dc;
  if (da) {
    // d op(a) = dc op(b)ᵀ : (m, k). Stored transposed when ta.
    if (!ta) gemm(*da, dc_read, b, false, !tb, 1.0, beta_a, GemmShape{s.batch, s.m, s.k, s.n});
    else gemm(*da, b, dc_read, tb, true, 1.0, beta_a, GemmShape{s.batch, s.k, s.m, s.n});
  }
  if (db) {
    // d op(b) = op(a)ᵀ dc : (k, n). Stored transposed when tb.
    if (!tb) gemm(*db, a, dc_read, !ta, false, 1.0, beta_b, GemmShape{s.batch, s.k, s.n, s.m});
    else gemm(*db, dc_read, a, true, ta, 1.0, beta_b, GemmShape{s.batch, s.n, s.k, s.m});
  }
}

// ---------------------------------------------------------------- autograd
struct MatmulNode final : autograd::Node {
  bool trans_a = false, trans_b = false;
  Tensor a, b;  // both inputs are needed: each one's gradient uses the other
  const char* name() const override { return "matmul"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("a", a);
    visit.input("b", b);
  }
  void backward() override {
    bool fresh_a = false, fresh_b = false;  // a first gradient is written, not added to zeros
    Tensor da = a.requires_grad() ? a.grad_buffer(&fresh_a) : Tensor();
    Tensor db = b.requires_grad() ? b.grad_buffer(&fresh_b) : Tensor();
    matmul_backward(da.defined() ? &da : nullptr, db.defined() ? &db : nullptr, outputs[0].grad(), a, b, trans_a,
                    trans_b, fresh_a ? 0.0 : 1.0, fresh_b ? 0.0 : 1.0);
  }
};

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_float("matmul", a, "a");
  check_float("matmul", b, "b");
  if (b.ndim() == 2 && a.ndim() > 2) {  // shared weight: fold the batch into the rows of a
    CAST_CHECK(!ta, "matmul: a transposed a with a shared 2-D b is not supported ({} and {})", a.describe(),
               b.describe());
    Shape out_shape = a.shape();
    Tensor flat = reshape(a, {-1, a.dim(-1)});
    Tensor c = matmul(flat, b, false, tb);
    out_shape.back() = c.dim(-1);
    return reshape(c, out_shape);
  }
  GemmShape s = matmul_shape(a, b, ta, tb);
  Shape shape(a.shape().begin(), a.shape().end() - 2);
  shape.push_back(s.m);
  shape.push_back(s.n);
  Tensor c = Tensor::empty(shape, a.dtype(), a.device());
  matmul_forward(c, a, b, ta, tb);
  if (autograd::needs_grad({&a, &b})) {
    auto node = std::make_unique<MatmulNode>();
    node->trans_a = ta;
    node->trans_b = tb;
    node->a = a;
    node->b = b;
    node->outputs = {c};
    autograd::record(std::move(node));
  }
  return c;
}

}  // namespace cast::ops
