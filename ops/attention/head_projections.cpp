#include "ops/attention/head_projections.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"

namespace cast::ops {

namespace {

std::atomic<HeadProjections> g_cuda_way{HeadProjections::in_place};
// Whether x's products run head by head in place: on CUDA, unless the permuted way is chosen.
bool in_place(const Tensor& x) { return x.is_cuda() && g_cuda_way.load() == HeadProjections::in_place; }

const std::vector<int> kSplit = {0, 2, 1, 3};  // (B, N, H, d) <-> (B, H, N, d), its own inverse

Tensor like(const Shape& shape, const Tensor& t) { return Tensor::empty(shape, t.dtype(), t.device()); }

// c = op(a) op(b) + beta c, a's leading dims folded into rows (b is 2-D)
void product(Tensor& c, const Tensor& a, const Tensor& b, bool ta, bool tb, double beta) {
  gemm(c, a, b, ta, tb, 1.0, beta, matmul_shape(a, b, ta, tb));
}

// (B, H, N, d) -> a new (B·N, H·d) in token-major order, and back (added or written)
Tensor tokens_major(const Tensor& heads) {
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3);
  Tensor rows = like({B, N, H, d}, heads);
  permute_forward(rows, heads, kSplit);
  return rows.view({B * N, H * d});
}
// Rows [r0, r0 + n) of tokens_major(heads) into rows (n, H·d), on the CPU.
void gather_token_rows(Tensor& rows, const Tensor& heads, int64_t r0) {
  const int64_t H = heads.dim(1), N = heads.dim(2), d = heads.dim(3), n = rows.dim(0);
  CAST_DISPATCH_FLOAT(heads.dtype(), "project_heads", [&] {
    const T* src = heads.data<T>();
    T* dst = rows.data<T>();
    CAST_OMP("omp parallel for if (n * H * d >= (1 << 16))")
    for (int64_t r = 0; r < n; ++r) {
      const int64_t b = (r0 + r) / N, i = (r0 + r) % N;
      for (int64_t h = 0; h < H; ++h) std::copy_n(src + ((b * H + h) * N + i) * d, d, dst + (r * H + h) * d);
    }
  });
}
// A chunk of at least this many rows keeps the products at the BLAS's rate; of at most this
// many elements (1 MiB of f32), unless a row is wider.
constexpr int64_t kMinChunkRows = 256, kChunkElements = int64_t(1) << 18;

void to_heads(Tensor& heads, const Tensor& rows, bool accumulate) {
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3);
  permute_forward(heads, rows.view({B, N, H, d}), kSplit, accumulate);
}

// ---- CUDA: the heads in place. Each product reads or writes head h of every batch row where it
// lies in (B, H, N, d) (N rows d apart, batch rows H·N·d apart) and head h's d columns or rows of
// the weight, one strided batched product per head: no permuted copy and no permute kernel. A
// weight's gradient sums over the batch rows, so each head's batch of products writes its own
// term (B, ·, ·) and one column sum adds them: B · D · H·d floats (8 MiB for the Text preset),
// where the token-major copy it replaces held B · N · H·d.

// Head h of heads (B, H, N, d), as B matrices (N, d).
MatrixLayout head_of(const Tensor& heads, int64_t h) {
  const int64_t H = heads.dim(1), N = heads.dim(2), d = heads.dim(3);
  return {h * N * d, d, H * N * d};
}
// Each batch row of x (B, rows, cols), as B matrices.
MatrixLayout batch_rows(const Tensor& x) { return {0, x.dim(2), x.dim(1) * x.dim(2)}; }
// Columns [c0, c0 + n) of a 2-D w, the same matrix for every batch row.
MatrixLayout columns_of(const Tensor& w, int64_t c0) { return {c0, w.dim(1), 0}; }
// Rows [r0, …) of a 2-D w, the same matrix for every batch row.
MatrixLayout rows_of(const Tensor& w, int64_t r0) { return {r0 * w.dim(1), w.dim(1), 0}; }

// An input's gradient buffer for a backward (none where the input needs none), and whether it is
// fresh: written by the first product into it (beta 0), not added to what it held.
struct GradientOf {
  explicit GradientOf(Tensor& input) {
    if (input.requires_grad()) buffer = input.grad_buffer(&fresh);
  }
  Tensor buffer;
  bool fresh = false;
};

// w's gradient (beta 0: written, 1: added) from per-batch terms (B, w's shape) filled by `fill`.
void sum_terms_into(Tensor& dw, bool fresh, int64_t batch, const std::function<void(Tensor& terms)>& fill) {
  Tensor terms = like({batch, dw.dim(0), dw.dim(1)}, dw);
  fill(terms);
  const Tensor sum = sum_to_shape(terms, dw.shape());
  if (fresh) dw.copy_from(sum);
  else add_into(dw, sum);
}

// y (B, H, N, d) = x (B, N, D) w (D, H·d), head by head.
void project_heads_in_place(Tensor& y, const Tensor& x_in, const Tensor& w) {
  const int64_t B = y.dim(0), H = y.dim(1), N = y.dim(2), d = y.dim(3), D = x_in.dim(2);
  const Tensor x = as_product_operand(x_in);  // every head's product reads all of x
  for (int64_t h = 0; h < H; ++h)
    gemm_laid_out(y, head_of(y, h), x, batch_rows(x), w, columns_of(w, h * d), false, false, 1.0, 0.0, {B, N, d, D});
}

// dx (B, N, D) (+)= Σ_h dy[:, h] w[:, h]ᵀ, and dw[:, h] (+)= Σ_b x[b]ᵀ dy[b, h].
void project_heads_backward_in_place(GradientOf& dx, GradientOf& dw, const Tensor& dy, const Tensor& x_in,
                                     const Tensor& w) {
  const int64_t B = dy.dim(0), H = dy.dim(1), N = dy.dim(2), d = dy.dim(3), D = x_in.dim(2);
  const Tensor x = dw.buffer.defined() ? as_product_operand(x_in) : x_in;  // read by every head's term
  if (dx.buffer.defined())
    for (int64_t h = 0; h < H; ++h)
      gemm_laid_out(dx.buffer, batch_rows(x), dy, head_of(dy, h), w, columns_of(w, h * d), false, true, 1.0,
                    dx.fresh && h == 0 ? 0.0 : 1.0, {B, N, D, d});
  if (dw.buffer.defined())
    sum_terms_into(dw.buffer, dw.fresh, B, [&](Tensor& terms) {
      if (N == 0) return terms.fill_zero();  // sums of no products (cuBLAS writes nothing for them)
      for (int64_t h = 0; h < H; ++h)
        gemm_laid_out(terms, {h * d, H * d, D * H * d}, x, batch_rows(x), dy, head_of(dy, h), true, false, 1.0, 0.0,
                      {B, D, d, N});
    });
}

// out (B, N, E) = Σ_h heads[:, h] w[h·d : (h+1)·d, :], head by head.
void merge_heads_project_in_place(Tensor& out, const Tensor& heads, const Tensor& w) {
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3), E = w.dim(1);
  for (int64_t h = 0; h < H; ++h)
    gemm_laid_out(out, batch_rows(out), heads, head_of(heads, h), w, rows_of(w, h * d), false, false, 1.0,
                  h == 0 ? 0.0 : 1.0, {B, N, E, d});
}

// dheads[:, h] (+)= dout w[h rows]ᵀ, and dw[h rows] (+)= Σ_b heads[b, h]ᵀ dout[b].
void merge_heads_backward_in_place(GradientOf& dheads, GradientOf& dw, const Tensor& dout_in, const Tensor& heads,
                                   const Tensor& w) {
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3), E = w.dim(1);
  const Tensor dout = as_product_operand(dout_in);  // every head's products read all of dout
  if (dheads.buffer.defined())
    for (int64_t h = 0; h < H; ++h)
      gemm_laid_out(dheads.buffer, head_of(heads, h), dout, batch_rows(dout), w, rows_of(w, h * d), false, true, 1.0,
                    dheads.fresh ? 0.0 : 1.0, {B, N, d, E});
  if (dw.buffer.defined())
    sum_terms_into(dw.buffer, dw.fresh, B, [&](Tensor& terms) {
      if (N == 0) return terms.fill_zero();  // sums of no products (cuBLAS writes nothing for them)
      for (int64_t h = 0; h < H; ++h)
        gemm_laid_out(terms, {h * d * E, E, H * d * E}, heads, head_of(heads, h), dout, batch_rows(dout), true, false,
                      1.0, 0.0, {B, d, E, N});
    });
}

struct ProjectHeadsNode final : autograd::Node {
  Tensor x, w;  // inputs (B, N, D), (D, H·d)
  const char* name() const override { return "project_heads"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("w", w);
  }
  // The CPU needs the gradient dY token-major, (B·N, H·d). This backward runs while the gradients
  // of all three projections are alive (the layer's peak), so it lays dY out a chunk of rows at a
  // time rather than as a second whole copy. CUDA reads dY in place, head by head.
  void backward() override {
    const Tensor& dheads = outputs[0].grad();  // (B, H, N, d)
    if (in_place(dheads)) {
      GradientOf dx(x), dw(w);
      return project_heads_backward_in_place(dx, dw, dheads, x, w);
    }
    const int64_t rows = x.dim(0) * x.dim(1), width = w.dim(1);
    const Tensor x2 = x.view({rows, x.dim(2)});
    if (dheads.is_cuda()) {  // permuted: the gradient token-major whole, then two products
      bool x_fresh = false, w_fresh = false;
      const Tensor dy = tokens_major(dheads);
      if (x.requires_grad()) {
        Tensor dx = x.grad_buffer(&x_fresh).view(x2.shape());
        product(dx, dy, w, false, true, x_fresh ? 0.0 : 1.0);
      }
      if (w.requires_grad()) {
        Tensor dw = w.grad_buffer(&w_fresh);
        if (rows == 0 && w_fresh) dw.fill_zero();  // cuBLAS writes nothing for a sum of no products
        else product(dw, x2, dy, true, false, w_fresh ? 0.0 : 1.0);
      }
      return;
    }
    const int64_t chunk = std::min(rows, std::max(kMinChunkRows, kChunkElements / width));
    Tensor buffer = like({chunk, width}, dheads);
    bool x_fresh = false, w_fresh = false;  // a first gradient is written by the product, not added to zeros
    Tensor dx = x.requires_grad() ? x.grad_buffer(&x_fresh).view(x2.shape()) : Tensor();
    Tensor dw = w.requires_grad() ? w.grad_buffer(&w_fresh) : Tensor();
    if (rows == 0 && w_fresh) dw.fill_zero();  // no chunk writes it: a sum of no products
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t n = std::min(chunk, rows - r0);
      Tensor dy = buffer.narrow0(0, n);  // token-major rows [r0, r0 + n)
      gather_token_rows(dy, dheads, r0);
      if (dx.defined()) {
        Tensor dx_rows = dx.narrow0(r0, n);
        product(dx_rows, dy, w, false, true, x_fresh ? 0.0 : 1.0);  // dX = dY Wᵀ
      }
      if (dw.defined()) product(dw, x2.narrow0(r0, n), dy, true, false, w_fresh && r0 == 0 ? 0.0 : 1.0);  // += Xᵀ dY
    }
  }
};

struct MergeHeadsProjectNode final : autograd::Node {
  Tensor heads, w;  // inputs (B, H, N, d), (H·d, E)
  const char* name() const override { return "merge_heads_project"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("heads", heads);
    visit.input("w", w);
  }
  void backward() override {
    const Tensor& dout = outputs[0].grad();  // (B, N, E)
    if (in_place(dout)) {
      GradientOf dh(heads), dw(w);
      return merge_heads_backward_in_place(dh, dw, dout, heads, w);
    }
    const Tensor dout2 = dout.view({dout.dim(0) * dout.dim(1), dout.dim(2)});
    bool fresh = false;
    if (w.requires_grad()) {  // dW = Xᵀ dO, the heads in token-major order again
      Tensor dw = w.grad_buffer(&fresh);
      product(dw, tokens_major(heads), dout2, true, false, fresh ? 0.0 : 1.0);
    }
    if (heads.requires_grad()) {  // dHeads = dO Wᵀ, split into heads
      Tensor rows = like({dout2.dim(0), w.dim(0)}, dout);
      product(rows, dout2, w, false, true, 0.0);
      Tensor dh = heads.grad_buffer(&fresh);
      to_heads(dh, rows, /*accumulate=*/!fresh);
    }
  }
};

// The checks both ops make: a float input of `ndim` dims and a 2-D w, on one device and dtype.
void check_operands(const char* op, const Tensor& in, const char* name, int ndim, const Tensor& w) {
  check_float(op, in, name);
  check_ndim(op, in, ndim, name);
  check_ndim(op, w, 2, "w");
  check_same_dtype(op, in, w);
  check_same_device(op, in, w);
}

}  // namespace

void set_cuda_head_projections(HeadProjections way) { g_cuda_way.store(way); }
HeadProjections cuda_head_projections() { return g_cuda_way.load(); }

Tensor project_heads(const Tensor& x, const Tensor& w, int64_t heads) {
  const char* op = "project_heads";
  check_operands(op, x, "x", 3, w);
  CAST_CHECK(heads > 0 && w.dim(0) == x.dim(2) && w.dim(1) % heads == 0,
             "{}: w {} must be [{}, a multiple of the {} heads]", op, w.describe(), x.dim(2), heads);
  const int64_t B = x.dim(0), N = x.dim(1), d = w.dim(1) / heads;
  Tensor out = like({B, heads, N, d}, x);
  if (in_place(x)) {
    project_heads_in_place(out, x, w);
  } else {
    Tensor y = like({B * N, w.dim(1)}, x);  // the product, a temporary
    product(y, x.view({B * N, x.dim(2)}), w, false, false, 0.0);
    to_heads(out, y, /*accumulate=*/false);
  }
  if (autograd::needs_grad({&x, &w})) {
    auto node = std::make_unique<ProjectHeadsNode>();
    node->x = x, node->w = w;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

Tensor merge_heads_project(const Tensor& heads, const Tensor& w) {
  const char* op = "merge_heads_project";
  check_operands(op, heads, "heads", 4, w);
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3);
  CAST_CHECK(w.dim(0) == H * d, "{}: w {} must have {} rows (heads {} × width {})", op, w.describe(), H * d, H, d);
  Tensor out = like({B, N, w.dim(1)}, heads);
  if (in_place(heads)) {
    merge_heads_project_in_place(out, heads, w);
  } else {
    Tensor out2 = out.view({B * N, w.dim(1)});
    product(out2, tokens_major(heads), w, false, false, 0.0);
  }
  if (autograd::needs_grad({&heads, &w})) {
    auto node = std::make_unique<MergeHeadsProjectNode>();
    node->heads = heads, node->w = w;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
