#include "ops/convert.h"

#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#ifdef CAST_WITH_CUDA
#include "cuda/convert.h"
#endif

namespace cast::ops {

namespace {

// Element i of a float tensor's storage as a double (exact for every float dtype).
double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.data<float>()[i];
    case DType::f64: return t.data<double>()[i];
    default: return bf16_value(t.data<bfloat16>()[i].bits);
  }
}

// Stores v into element i, rounded once to the tensor's dtype.
void store(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = static_cast<float>(v); break;
    case DType::f64: t.data<double>()[i] = v; break;
    default: t.data<bfloat16>()[i].bits = bf16_bits_of_double(v); break;
  }
}

void check_convertible(const char* op, const Tensor& a, const Tensor& b) {
  CAST_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), "{}: converts float tensors (f32, f64, bf16), got {} and {}",
             op, a.describe(), b.describe());
  CAST_CHECK(a.numel() == b.numel(), "{}: {} and {} differ in size", op, a.describe(), b.describe());
  CAST_CHECK(a.device() == b.device(), "{}: {} and {} are on different devices", op, a.describe(), b.describe());
}

}  // namespace

void convert_forward(Tensor& out, const Tensor& x) {
  check_convertible("convert", out, x);
  CAST_ON_CUDA(x, cuda::convert(out, x, false));
  const int64_t n = x.numel();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) store(out, i, load(x, i));
}

void convert_backward(Tensor& dx, const Tensor& dout) {
  check_convertible("convert backward", dx, dout);
  CAST_ON_CUDA(dx, cuda::convert(dx, dout, true));
  const int64_t n = dx.numel();
#pragma omp parallel for if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const double sum = dx.dtype() == DType::f64 ? load(dx, i) + load(dout, i)
                                                : static_cast<double>(static_cast<float>(load(dx, i)) +
                                                                      static_cast<float>(load(dout, i)));
    store(dx, i, sum);
  }
}

struct ConvertNode final : autograd::Node {
  Tensor x;  // input, whose gradient takes the output's, converted back
  const char* name() const override { return "convert"; }
  void fields(autograd::FieldVisitor& visit) const override { visit.input("x", x); }
  void backward() override {
    Tensor dx = x.grad_accumulator();
    convert_backward(dx, outputs[0].grad());
  }
};

Tensor convert(const Tensor& x, DType dtype) {
  CAST_CHECK(is_floating(x.dtype()) && is_floating(dtype), "convert: from {} to {}: float dtypes only (f32, f64, bf16)",
             x.describe(), dtype_name(dtype));
  CAST_CHECK(x.device() == Device::cpu || (x.dtype() != DType::f64 && dtype != DType::f64),
             "convert: {} to {}: f64 is supported on the CPU only", x.describe(), dtype_name(dtype));
  if (x.dtype() == dtype) return x;
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  convert_forward(out, x);
  if (autograd::needs_grad({&x})) {
    auto node = std::make_unique<ConvertNode>();
    node->x = x;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
