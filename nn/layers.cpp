#include "nn/layers.h"

#include <cmath>

#include "autograd/trace.h"
#include "ops/ops.h"

namespace cast::nn {

Tensor Initializer::normal(const Shape& shape, double stddev) {
  Tensor t = Tensor::normal(shape, seed, offset, stddev, dtype, device);
  offset += shape_numel(shape);
  return t.set_requires_grad();
}

Tensor Initializer::constant(const Shape& shape, double value) {
  return Tensor::full(shape, value, dtype, device).set_requires_grad();
}

Linear::Linear(int64_t in, int64_t out, bool with_bias, Initializer& init)
    : weight(init.normal({in, out}, 1.0 / std::sqrt(static_cast<double>(in)))) {
  if (with_bias) bias = init.constant({out}, 0.0);
}

Tensor Linear::forward(const Tensor& x) const {
  if (fused && bias.defined()) {
    autograd::FastPathScope by("linear");
    return ops::linear(x, weight, bias);
  }
  Tensor y = ops::matmul(x, weight);
  return bias.defined() ? ops::add(y, bias) : y;
}

void Linear::collect_parameters(ParamList& out, const std::string& prefix) {
  out.push_back({join_name(prefix, "weight"), &weight});
  if (bias.defined()) out.push_back({join_name(prefix, "bias"), &bias});
}

LayerNorm::LayerNorm(int64_t dim, Initializer& init)
    : gamma(init.constant({dim}, 1.0)), beta(init.constant({dim}, 0.0)) {}

Tensor LayerNorm::forward(const Tensor& x) const { return ops::layernorm(x, gamma, beta, 1e-6); }

void LayerNorm::collect_parameters(ParamList& out, const std::string& prefix) {
  out.push_back({join_name(prefix, "gamma"), &gamma});
  out.push_back({join_name(prefix, "beta"), &beta});
}

Mlp::Mlp(int64_t dim, int64_t hidden, Initializer& init) : up(dim, hidden, true, init), down(hidden, dim, true, init) {}

Tensor Mlp::forward(const Tensor& x) const {
  if (up.fused && up.bias.defined() && down.bias.defined()) {
    autograd::FastPathScope by("mlp");
    return ops::mlp(x, up.weight, up.bias, down.weight, down.bias);
  }
  return down.forward(ops::gelu(up.forward(x)));
}

void Mlp::collect_parameters(ParamList& out, const std::string& prefix) {
  up.collect_parameters(out, join_name(prefix, "up"));
  down.collect_parameters(out, join_name(prefix, "down"));
}

}  // namespace cast::nn
