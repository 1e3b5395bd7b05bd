#include "ops/head_projections.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/layout.h"
#include "ops/matmul.h"

namespace cast::ops {

namespace {

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
void to_heads(Tensor& heads, const Tensor& rows, bool accumulate) {
  const int64_t B = heads.dim(0), H = heads.dim(1), N = heads.dim(2), d = heads.dim(3);
  permute_forward(heads, rows.view({B, N, H, d}), kSplit, accumulate);
}

struct ProjectHeadsNode final : autograd::Node {
  Tensor x, w;  // inputs (B, N, D), (D, H·d)
  const char* name() const override { return "project_heads"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("w", w);
  }
  void backward() override {
    const Tensor dy = tokens_major(outputs[0].grad());  // (B·N, H·d)
    const Tensor x2 = x.view({x.dim(0) * x.dim(1), x.dim(2)});
    bool fresh = false;  // a first gradient is written by the product, not added to zeros
    if (x.requires_grad()) {
      Tensor dx = x.grad_buffer(&fresh).view(x2.shape());
      product(dx, dy, w, false, true, fresh ? 0.0 : 1.0);  // dX = dY Wᵀ
    }
    if (w.requires_grad()) {
      Tensor dw = w.grad_buffer(&fresh);
      product(dw, x2, dy, true, false, fresh ? 0.0 : 1.0);  // dW = Xᵀ dY
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

Tensor project_heads(const Tensor& x, const Tensor& w, int64_t heads) {
  const char* op = "project_heads";
  check_operands(op, x, "x", 3, w);
  CAST_CHECK(heads > 0 && w.dim(0) == x.dim(2) && w.dim(1) % heads == 0,
             "{}: w {} must be [{}, a multiple of the {} heads]", op, w.describe(), x.dim(2), heads);
  const int64_t B = x.dim(0), N = x.dim(1), d = w.dim(1) / heads;
  Tensor y = like({B * N, w.dim(1)}, x);  // the product, a temporary
  product(y, x.view({B * N, x.dim(2)}), w, false, false, 0.0);
  Tensor out = like({B, heads, N, d}, x);
  to_heads(out, y, /*accumulate=*/false);
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
  Tensor out2 = out.view({B * N, w.dim(1)});
  product(out2, tokens_major(heads), w, false, false, 0.0);
  if (autograd::needs_grad({&heads, &w})) {
    auto node = std::make_unique<MergeHeadsProjectNode>();
    node->heads = heads, node->w = w;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
