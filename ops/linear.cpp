#include "ops/linear.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace cast::ops {

namespace {

// A view of t with its leading dims folded into rows: (..., n) -> (R, n).
Tensor rows_of(const Tensor& t) { return t.view({t.numel() / t.dim(-1), t.dim(-1)}); }

// x may be a BF16 operand beside an FP32 w where the products take BF16 (ops::check_operand_pair)
void check_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_operand_pair("linear", x, "x", w, "w");
  check_same_dtype("linear", w, b);
  check_same_device("linear", x, w);
  check_same_device("linear", x, b);
  CAST_CHECK(x.ndim() >= 1 && w.ndim() == 2 && b.ndim() == 1 && w.dim(0) == x.dim(-1) && b.dim(0) == w.dim(1),
             "linear: x {}, w {} and b {} are not (..., K), (K, N) and (N)", x.describe(), w.describe(), b.describe());
}

}  // namespace

void linear_product(Tensor& y, const Tensor& x, const Tensor& w) {
  Tensor y2 = rows_of(y);
  const Tensor x2 = rows_of(x);
  gemm(y2, x2, w, false, false, 1.0, 0.0, matmul_shape(x2, w, false, false));
}

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  linear_product(y, x, w);
  Tensor y2 = rows_of(y);
  binary_forward(y2, BinaryOp::add, y2, b);  // in place: each element reads and writes its own
}

void linear_backward(Tensor* dx, Tensor* dw, Tensor* db, const Tensor& dy, const Tensor& x, const Tensor& w,
                     double beta_x, double beta_w, double beta_b) {
  const Tensor dy2 = rows_of(dy), x2 = rows_of(x);
  Tensor dx2 = dx ? rows_of(*dx) : Tensor();
  matmul_backward(dx ? &dx2 : nullptr, dw, dy2, x2, w, false, false, beta_x, beta_w);
  if (!db) return;
  const Tensor sums = sum_to_shape(dy, db->shape());  // dy's own shape: the reference's order of sums
  if (beta_b == 0.0) affine_forward(*db, sums, 1.0, 0.0);
  else add_into(*db, sums);
}

struct LinearNode final : autograd::Node {
  Tensor x, w, b;  // x and w for each other's gradient; b only to receive its own
  const char* name() const override { return "linear"; }
  bool backward_reads_outputs() const override { return false; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("w", w);
    visit.input("b", b);
  }
  void backward() override {
    bool fresh_x = false, fresh_w = false, fresh_b = false;  // a first gradient is written, not added to zeros
    Tensor dx = x.requires_grad() ? x.grad_buffer(&fresh_x) : Tensor();
    Tensor dw = w.requires_grad() ? w.grad_buffer(&fresh_w) : Tensor();
    Tensor db = b.requires_grad() ? b.grad_buffer(&fresh_b) : Tensor();
    linear_backward(dx.defined() ? &dx : nullptr, dw.defined() ? &dw : nullptr, db.defined() ? &db : nullptr,
                    outputs[0].grad(), x, w, fresh_x ? 0.0 : 1.0, fresh_w ? 0.0 : 1.0, fresh_b ? 0.0 : 1.0);
  }
};

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_linear(x, w, b);
  Shape shape = x.shape();
  shape.back() = w.dim(1);
  Tensor y = Tensor::empty(shape, w.dtype(), x.device());  // x may be a BF16 operand
  linear_forward(y, x, w, b);
  if (autograd::needs_grad({&x, &w, &b})) {
    auto node = std::make_unique<LinearNode>();
    node->x = x, node->w = w, node->b = b;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
