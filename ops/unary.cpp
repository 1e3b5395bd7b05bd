#include "ops/unary.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/unary.h"
#endif

namespace cast::ops {

void unary_forward(Tensor& y, UnaryOp op, const Tensor& x) {
  check_float(unary_name(op), x, "x");
  check_same_shape(unary_name(op), y, x);
  CAST_ON_CUDA(x, cuda::unary_forward(y, op, x));
  CAST_DISPATCH_FLOAT(x.dtype(), unary_name(op), [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
_Pragma("omp parallel for if (n > 65536)")
    for (int64_t i = 0; i < n; ++i) py[i] = unary_apply(op, px[i]);
  });
}

void unary_backward(Tensor& dx, UnaryOp op, const Tensor& dy, const Tensor& x, const Tensor& y) {
  CAST_ON_CUDA(x, cuda::unary_backward(dx, op, dy, x, y));
  CAST_DISPATCH_FLOAT(x.dtype(), unary_name(op), [&] {
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
_Pragma("omp parallel for if (n > 65536)")
    for (int64_t i = 0; i < n; ++i) pdx[i] += pdy[i] * unary_derivative(op, px[i], py[i]);
  });
}

struct UnaryNode final : autograd::Node {
  UnaryOp op;
  Tensor x;  // input, for derivatives written in x (log, relu, gelu, laplace)
  Tensor y;  // output, for derivatives written in y (exp, sqrt, sigmoid)
  const char* name() const override { return unary_name(op); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    unary_backward(dx, op, y.grad(), x, y);
  }
};

Tensor unary(UnaryOp op, const Tensor& x) {
  check_float(unary_name(op), x, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary_forward(y, op, x);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<UnaryNode>();
    node->op = op;
    node->x = x;
    node->y = y;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

}  // namespace cast::ops
