#include "ops/elementwise.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/reduce.h"
#ifdef CAST_WITH_CUDA
#include "cuda/elementwise.h"
#endif

namespace cast::ops {

static const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    default: return "div";
  }
}

// ---------------------------------------------------------------- CPU loops
// The output is walked one row (its last dim) at a time: the row's offsets into a and b are
// computed once, then each input is read at a fixed stride (1, or 0 where it is broadcast),
// so the inner loops vectorise.
struct RowStrides {
  int64_t len, a, b;
};

template <class F>
static void for_each_row(const BroadcastIndex& idx, int64_t n, F&& row) {
  const int last = idx.ndim - 1;
  const RowStrides r{last >= 0 ? idx.shape[last] : 1, last >= 0 ? idx.stride_a[last] : 0,
                     last >= 0 ? idx.stride_b[last] : 0};
  const int64_t rows = r.len ? n / r.len : 0;
  CAST_OMP("omp parallel for if (n > 65536)")
  for (int64_t k = 0; k < rows; ++k) {
    int64_t ia, ib;
    idx.offsets(k * r.len, ia, ib);
    row(k * r.len, ia, ib, r);
  }
}

// Calls body with the op as a function object, so the loop inside is compiled per op.
template <class Body>
static void with_op(BinaryOp op, Body&& body) {
  switch (op) {
    case BinaryOp::add: return body([](auto x, auto y) { return x + y; });
    case BinaryOp::sub: return body([](auto x, auto y) { return x - y; });
    case BinaryOp::mul: return body([](auto x, auto y) { return x * y; });
    default: return body([](auto x, auto y) { return x / y; });
  }
}

// ---------------------------------------------------------------- forward / backward pair
void binary_forward(Tensor& out, BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_float(name, a, "a");
  check_same_dtype(name, a, b);
  check_same_device(name, a, b);
  Shape shape = broadcast_shapes(name, a.shape(), b.shape());
  CAST_CHECK(out.shape() == shape, "{}: output {} is not the broadcast shape {}", name, out.describe(),
             shape_str(shape));
  BroadcastIndex idx = make_broadcast_index(shape, a.shape(), b.shape());
  CAST_ON_CUDA(a, cuda::binary_forward(out, op, a, b, idx));
  CAST_DISPATCH_FLOAT(a.dtype(), name, [&] {
    const T *pa = a.data<T>(), *pb = b.data<T>();
    T* po = out.data<T>();
    for_each_row(idx, out.numel(), [&](int64_t i, int64_t ia, int64_t ib, const RowStrides& r) {
      with_op(op, [&](auto f) {
        const T *ra = pa + ia, *rb = pb + ib;
        T* ro = po + i;
        if (r.a == 1 && r.b == 1)
          for (int64_t j = 0; j < r.len; ++j) ro[j] = f(ra[j], rb[j]);
        else if (r.a == 1 && r.b == 0)
          for (int64_t j = 0; j < r.len; ++j) ro[j] = f(ra[j], rb[0]);
        else if (r.a == 0 && r.b == 1)
          for (int64_t j = 0; j < r.len; ++j) ro[j] = f(ra[0], rb[j]);
        else
          for (int64_t j = 0; j < r.len; ++j) ro[j] = f(ra[j * r.a], rb[j * r.b]);
      });
    });
  });
}

// add and sub: each derivative is ±1, so an input's gradient is dout summed down to the input's
// shape (a bias: over the rows), added in place with its sign. No partial buffer is made and no
// derivative is evaluated.
static void add_sub_backward(Tensor* da, Tensor* db, BinaryOp op, const Tensor& dout, const Tensor& a,
                             const Tensor& b) {
  if (da) add_into(*da, sum_to_shape(dout, a.shape()));
  if (db) add_into(*db, sum_to_shape(dout, b.shape()), op == BinaryOp::sub ? -1.0 : 1.0);
}

// mul and div: partial gradients of full size, summed down to each input's shape; an input of
// the output's shape takes its partial directly, with no full-size temporary.
void binary_backward(Tensor* da, Tensor* db, BinaryOp op, const Tensor& dout, const Tensor& a, const Tensor& b) {
  if (op == BinaryOp::add || op == BinaryOp::sub) return add_sub_backward(da, db, op, dout, a, b);
  BroadcastIndex idx = make_broadcast_index(dout.shape(), a.shape(), b.shape());
  const bool direct_a = da && a.shape() == dout.shape() && !dout.is_cuda();
  const bool direct_b = db && b.shape() == dout.shape() && !dout.is_cuda();
  Tensor ga = da && !direct_a ? Tensor::empty(dout.shape(), dout.dtype(), dout.device()) : Tensor();
  Tensor gb = db && !direct_b ? Tensor::empty(dout.shape(), dout.dtype(), dout.device()) : Tensor();
  auto partials = [&] {
    CAST_ON_CUDA(dout, cuda::binary_backward(da ? &ga : nullptr, db ? &gb : nullptr, op, dout, a, b, idx));
    CAST_DISPATCH_FLOAT(a.dtype(), binary_name(op), [&] {
      const T *pa = a.data<T>(), *pb = b.data<T>(), *pd = dout.data<T>();
      T* pga = direct_a ? da->data<T>() : da ? ga.data<T>() : nullptr;
      T* pgb = direct_b ? db->data<T>() : db ? gb.data<T>() : nullptr;
      // the op is fixed per loop, and a partial either starts the gradient or adds to it, so
      // each loop vectorises
      auto rows = [&](auto is_mul) {
        constexpr BinaryOp kOp = decltype(is_mul)::value ? BinaryOp::mul : BinaryOp::div;
        for_each_row(idx, dout.numel(), [&](int64_t i, int64_t ia, int64_t ib, const RowStrides& r) {
          const T *x = pa + ia, *y = pb + ib, *g = pd + i;
          if (pga && direct_a)
            for (int64_t j = 0; j < r.len; ++j) pga[i + j] += g[j] * binary_da(kOp, x[j * r.a], y[j * r.b]);
          else if (pga)
            for (int64_t j = 0; j < r.len; ++j) pga[i + j] = g[j] * binary_da(kOp, x[j * r.a], y[j * r.b]);
          if (pgb && direct_b)
            for (int64_t j = 0; j < r.len; ++j) pgb[i + j] += g[j] * binary_db(kOp, x[j * r.a], y[j * r.b]);
          else if (pgb)
            for (int64_t j = 0; j < r.len; ++j) pgb[i + j] = g[j] * binary_db(kOp, x[j * r.a], y[j * r.b]);
        });
      };
      if (op == BinaryOp::mul) rows(std::true_type{});
      else rows(std::false_type{});
    });
  };
  partials();
  if (da && !direct_a) add_into(*da, sum_to_shape(ga, a.shape()));
  if (db && !direct_b) add_into(*db, sum_to_shape(gb, b.shape()));
}

// ---------------------------------------------------------------- autograd
struct BinaryNode final : autograd::Node {
  BinaryOp op;
  Tensor a, b;  // inputs, saved: mul and div need them for their derivatives
  const char* name() const override { return binary_name(op); }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("a", a);
    visit.input("b", b);
  }
  void backward() override {
    if (op == BinaryOp::add || op == BinaryOp::sub) return add_sub_pass_through();
    Tensor da = a.requires_grad() ? a.grad_accumulator() : Tensor();
    Tensor db = b.requires_grad() ? b.grad_accumulator() : Tensor();
    binary_backward(da.defined() ? &da : nullptr, db.defined() ? &db : nullptr, op, outputs[0].grad(), a, b);
  }
  // da += dout and db ±= dout (each summed to its input's shape), without a zero-filled buffer
  // to add into: b's gradient, when it has none yet, is written (dout copied, or its sum); then
  // a, of the output's shape and with no gradient yet, takes dout's own buffer (a residual's
  // stream, the common case), which no other reader sees once this node has run. b goes first
  // as a may take that buffer; a + a works too, as the second of its two gradients adds.
  void add_sub_pass_through() {
    const double sign = op == BinaryOp::sub ? -1.0 : 1.0;
    bool a_takes_buffer = false;
    {
      const Tensor dout = outputs[0].grad();
      if (b.requires_grad()) {
        bool fresh = false;
        Tensor db = b.grad_buffer(&fresh);
        if (fresh) affine_forward(db, sum_to_shape(dout, b.shape()), sign, 0.0);
        else add_into(db, sum_to_shape(dout, b.shape()), sign);
      }
      a_takes_buffer = a.requires_grad() && a.shape() == dout.shape() && !a.grad().defined();
      if (a.requires_grad() && !a_takes_buffer) add_into(a.grad_accumulator(), sum_to_shape(dout, a.shape()));
    }  // dout's copy goes here: the buffer is held by the output alone again
    if (a_takes_buffer && !autograd::pass_gradient(a, outputs[0])) autograd::accumulate(a, outputs[0].grad());
  }
};

static Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  check_float(binary_name(op), a, "a");
  check_float(binary_name(op), b, "b");
  Tensor out = Tensor::empty(broadcast_shapes(binary_name(op), a.shape(), b.shape()), a.dtype(), a.device());
  binary_forward(out, op, a, b);
  if (autograd::needs_grad({&a, &b})) {
    auto node = std::make_unique<BinaryNode>();
    node->op = op;
    node->a = a;
    node->b = b;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }

// ---------------------------------------------------------------- affine
void affine_forward(Tensor& y, const Tensor& x, double alpha, double beta) {
  check_float("affine", x, "x");
  check_same_shape("affine", y, x);
  CAST_ON_CUDA(x, cuda::affine(y, x, alpha, beta, /*accumulate=*/false));
  CAST_DISPATCH_FLOAT(x.dtype(), "affine", [&] {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(alpha) * px[i] + static_cast<T>(beta);
  });
}

void affine_backward(Tensor& dx, const Tensor& dy, double alpha) { add_into(dx, dy, alpha); }

struct AffineNode final : autograd::Node {
  double alpha = 1.0;
  Tensor x;  // input; only its gradient is needed
  const char* name() const override { return "affine"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    affine_backward(dx, outputs[0].grad(), alpha);
  }
};

Tensor affine(const Tensor& x, double alpha, double beta) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  affine_forward(y, x, alpha, beta);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<AffineNode>();
    node->alpha = alpha;
    node->x = x;
    node->outputs = {y};
    autograd::record(std::move(node));
  }
  return y;
}

// ---------------------------------------------------------------- helpers
void add_into(Tensor acc, const Tensor& g, double alpha) {
  check_same_shape("add_into", acc, g);
  check_same_dtype("add_into", acc, g);
  check_same_device("add_into", acc, g);
  CAST_ON_CUDA(acc, cuda::affine(acc, g, alpha, 0.0, /*accumulate=*/true));
  CAST_DISPATCH_FLOAT(acc.dtype(), "add_into", [&] {
    T* pa = acc.data<T>();
    const T* pg = g.data<T>();
    const int64_t n = acc.numel();
    CAST_OMP("omp parallel for if (n > 65536)")
    for (int64_t i = 0; i < n; ++i) pa[i] += static_cast<T>(alpha) * pg[i];
  });
}

// Gradient accumulation adds with add_into (autograd/tape.h): installed before main runs.
[[maybe_unused]] static const bool gradient_add_installed = [] {
  autograd::set_gradient_add([](Tensor acc, const Tensor& g) { add_into(acc, g); });
  return true;
}();

Tensor sum_to_shape(const Tensor& g, const Shape& target) {
  if (g.shape() == target) return g;
  const Shape& s = g.shape();
  size_t lead = s.size() - target.size();
  Tensor r = g;
  for (size_t i = 0; i < s.size(); ++i) {
    bool broadcast = i < lead || target[i - lead] == 1;
    if (broadcast && s[i] != 1) r = sum_axis_raw(r, static_cast<int>(i));
  }
  return r.view(target);
}

}  // namespace cast::ops
