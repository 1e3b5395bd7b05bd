// CAST step 3: the gate and the mixed affinities A_g; the reference of gated_affinity_fused.cpp.
#include <cmath>
#include <vector>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/step_blocks.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::ops {
using namespace step_blocks;

// ---------------------------------------------------------------- CAST step 3
// A_g = A_k + g ⊙ (A_q − A_k)
struct AffinityMixNode final : autograd::Node {
  Tensor g;         // (B, G, N, 1)
  Tensor a_q, a_k;  // (B, G, N, C)
  const char* name() const override { return "affinity_mix"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("g", g);
    visit.input("a_q", a_q);
    visit.input("a_k", a_k);
  }
  void backward() override {
    const Tensor& da = outputs[0].grad();
    // A_q − A_k again from the inputs, which the node holds anyway: not kept from the forward
    if (g.requires_grad())
      add_into(g.grad_accumulator(), sum_axis_raw(raw(BinaryOp::mul, da, raw(BinaryOp::sub, a_q, a_k)), -1));
    if (a_q.requires_grad()) add_into(a_q.grad_accumulator(), raw(BinaryOp::mul, da, g));
    if (a_k.requires_grad()) {
      Tensor one_minus_g = like(g.shape(), g);
      affine_forward(one_minus_g, g, -1.0, 1.0);
      add_into(a_k.grad_accumulator(), raw(BinaryOp::mul, da, one_minus_g));
    }
  }
};

Tensor cast_gate(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b) {
  return sigmoid(add(matmul(x, gate_w), gate_b));  // a linear layer and a sigmoid (recorded primitives)
}

Tensor mix_affinities(const Tensor& g, const Tensor& a_q, const Tensor& a_k) {
  const int64_t B = a_q.dim(0), G = a_q.dim(1), N = a_q.dim(2);
  CAST_CHECK(g.shape() == (Shape{B, N, G}), "mix_affinities: gate {} must be [{}, {}, {}] for affinities {}",
             g.describe(), B, N, G, a_q.describe());
  Tensor g4 = reshape(permute(g, {0, 2, 1}), {B, G, N, 1});  // (B, G, N, 1)
  Tensor diff = raw(BinaryOp::sub, a_q, a_k);
  Tensor a_g = raw(BinaryOp::add, a_k, raw(BinaryOp::mul, g4, diff));
  if (autograd::needs_grad({&g4, &a_q, &a_k})) {
    auto node = std::make_unique<AffinityMixNode>();
    node->g = g4, node->a_q = a_q, node->a_k = a_k;
    node->outputs = {a_g};
    autograd::record(std::move(node));
  }
  return a_g;
}

Tensor gated_affinity(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                      const Tensor& a_k) {
  autograd::StepScope named("gated_affinity");
  check_gated_affinity_inputs("gated_affinity", x, gate_w, gate_b, a_q, a_k);
  return mix_affinities(cast_gate(x, gate_w, gate_b), a_q, a_k);
}

}  // namespace cast::ops
