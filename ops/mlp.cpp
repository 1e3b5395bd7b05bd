#include "ops/mlp.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/matmul.h"
#include "ops/unary.h"
#ifdef CAST_WITH_CUDA
#include "cuda/mlp.h"
#endif

namespace cast::ops {

namespace {

Shape with_last(const Tensor& t, int64_t last) {
  Shape s = t.shape();
  s.back() = last;
  return s;
}

void check_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  check_float("mlp", x, "x");
  for (const Tensor* t : {&w1, &b1, &w2, &b2}) {
    check_same_dtype("mlp", x, *t);
    check_same_device("mlp", x, *t);
  }
  CAST_CHECK(x.ndim() >= 1 && w1.ndim() == 2 && b1.ndim() == 1 && w2.ndim() == 2 && b2.ndim() == 1 &&
                 w1.dim(0) == x.dim(-1) && b1.dim(0) == w1.dim(1) && w2.dim(0) == w1.dim(1) && b2.dim(0) == w2.dim(1),
             "mlp: x {}, w1 {}, b1 {}, w2 {} and b2 {} are not (..., D), (D, H), (H), (H, E) and (E)", x.describe(),
             w1.describe(), b1.describe(), w2.describe(), b2.describe());
}

// The dtype of the hidden activation a = GELU(z). Only W2's products read it (y = a W2 + b2 in
// the forward, dW2 = aᵀ dy in the backward), so where the products take BF16 operands the kernel
// that forms it writes it rounded to BF16, the values the products' own copy would hold: no FP32
// a is written and read back to be copied (two passes over the largest activation of a block).
DType hidden_dtype(const Tensor& z) { return products_take_bf16(z) ? DType::bf16 : z.dtype(); }

// z += b1 in place, then a = GELU(z): the reference's add and gelu ops (their CPU loops), in one
// kernel on the GPU.
void bias_gelu(Tensor& z, Tensor& a, const Tensor& b1) {
  if (z.numel() == 0) return;
  CAST_ON_CUDA(z, cuda::bias_gelu(z, a, b1));
  Tensor rows = z.view({z.numel() / b1.numel(), b1.numel()});
  binary_forward(rows, BinaryOp::add, rows, b1);
  unary_forward(a, UnaryOp::gelu, z);
}

// dz = da · GELU'(z), which reads z alone. The reference's gelu backward adds it into zeros: on
// the CPU so does this (its loop is the reference's), on the GPU it is written in da's place.
Tensor gelu_backward(Tensor& da, const Tensor& z) {
#ifdef CAST_WITH_CUDA
  if (z.is_cuda()) {
    cuda::gelu_backward(da, da, z);
    return da;
  }
#endif
  Tensor dz = Tensor::zeros(z.shape(), z.dtype(), z.device());
  unary_backward(dz, UnaryOp::gelu, da, z, z);  // the y argument: GELU's derivative does not read it
  return dz;
}

}  // namespace

void mlp_forward(Tensor& y, Tensor& z, const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                 const Tensor& b2) {
  check_mlp(x, w1, b1, w2, b2);
  linear_product(z, x, w1);
  Tensor a = Tensor::empty(z.shape(), hidden_dtype(z), z.device());  // (..., hidden), gone with this call
  bias_gelu(z, a, b1);
  linear_forward(y, a, w2, b2);
}

void mlp_backward(const MlpGrads& g, const Tensor& dy, const Tensor& x, const Tensor& z, const Tensor& w1,
                  const Tensor& w2) {
  // a = GELU(z) as the forward formed it, for W2's gradient
  Tensor a = Tensor::empty(z.shape(), hidden_dtype(z), z.device());
#ifdef CAST_WITH_CUDA
  if (a.dtype() == DType::bf16) cuda::gelu_bf16(a, z);
  else
#endif
    unary_forward(a, UnaryOp::gelu, z);
  // da = dy W2ᵀ, then dz = da · GELU'(z), added into zeros as the reference's gelu node adds
  Tensor da = Tensor::empty(z.shape(), z.dtype(), z.device());
  linear_backward(&da, g.dw2, g.db2, dy, a, w2, 0.0, g.beta[3], g.beta[4]);
  a = Tensor();
  const Tensor dz = gelu_backward(da, z);
  da = Tensor();
  linear_backward(g.dx, g.dw1, g.db1, dz, x, w1, g.beta[0], g.beta[1], g.beta[2]);
}

struct MlpNode final : autograd::Node {
  Tensor x, w1, b1, w2, b2;  // inputs
  Tensor z;                  // saved: the hidden layer before GELU (..., hidden)
  const char* name() const override { return "mlp"; }
  bool backward_reads_outputs() const override { return false; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("w1", w1);
    visit.input("b1", b1);
    visit.input("w2", w2);
    visit.input("b2", b2);
    visit.saved("z", z);
  }
  void backward() override {
    Tensor* ins[5] = {&x, &w1, &b1, &w2, &b2};
    Tensor grads[5];
    MlpGrads g;
    Tensor** slots[5] = {&g.dx, &g.dw1, &g.db1, &g.dw2, &g.db2};
    for (int i = 0; i < 5; ++i) {
      if (!ins[i]->requires_grad()) continue;
      bool fresh = false;  // a first gradient is written, not added to zeros
      grads[i] = ins[i]->grad_buffer(&fresh);
      *slots[i] = &grads[i];
      g.beta[i] = fresh ? 0.0 : 1.0;
    }
    mlp_backward(g, outputs[0].grad(), x, z, w1, w2);
  }
};

Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  check_mlp(x, w1, b1, w2, b2);
  Tensor z = Tensor::empty(with_last(x, w1.dim(1)), x.dtype(), x.device());
  Tensor y = Tensor::empty(with_last(x, w2.dim(1)), x.dtype(), x.device());
  mlp_forward(y, z, x, w1, b1, w2, b2);
  if (autograd::needs_grad({&x, &w1, &b1, &w2, &b2})) {
    auto node = std::make_unique<MlpNode>();
    node->x = x, node->w1 = w1, node->b1 = b1, node->w2 = w2, node->b2 = b2;
    node->z = z;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
