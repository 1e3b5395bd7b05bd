#pragma once
// The small building blocks of the Transformer: Linear, LayerNorm, MLP.
#include <cstdint>

#include "nn/module.h"

namespace cast::nn {

// Deterministic parameter initialisation: each tensor takes the next slice of one Philox stream.
struct Initializer {
  uint64_t seed = 0, offset = 0;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  Tensor normal(const Shape& shape, double stddev);
  Tensor constant(const Shape& shape, double value);
};

class Linear : public Module {
 public:
  Linear() = default;
  Linear(int64_t in, int64_t out, bool bias, Initializer& init);
  Tensor forward(const Tensor& x) const;  // (..., in) -> (..., out)
  void collect_parameters(ParamList& out, const std::string& prefix) override;
  Tensor weight, bias;  // (in, out), (out) or undefined
  // With a bias: one op (ops::linear, the fast path), else a matmul and an add (the reference,
  // what --reference runs): the same values and gradients.
  bool fused = true;
};

class LayerNorm : public Module {
 public:
  LayerNorm() = default;
  LayerNorm(int64_t dim, Initializer& init);
  Tensor forward(const Tensor& x) const;
  void collect_parameters(ParamList& out, const std::string& prefix) override;
  Tensor gamma, beta;
};

// Dense -> GELU -> Dense. With its Linears fused: one op (ops::mlp, which keeps the hidden layer
// once), else the three ops (the reference, what --reference runs): the same values and gradients.
class Mlp : public Module {
 public:
  Mlp() = default;
  Mlp(int64_t dim, int64_t hidden, Initializer& init);
  Tensor forward(const Tensor& x) const;
  void collect_parameters(ParamList& out, const std::string& prefix) override;
  Linear up, down;
};

}  // namespace cast::nn
