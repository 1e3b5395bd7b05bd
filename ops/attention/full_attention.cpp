// Full softmax attention (ATTENTION.md §1), the reference of flash_attention (full_attention_flash.cpp).
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

// ---------------------------------------------------------------- attention probabilities
// P = softmax(Q Kᵀ/√d + key mask). q: (B, H, M, d), k: (B, H, N, d) -> (B, H, M, N)
struct AttentionProbsNode final : autograd::Node {
  Tensor q, k;    // inputs
  Tensor mask;    // (B, N) or undefined
  Tensor probs;   // saved output P
  double factor;  // 1/√d
  const char* name() const override { return "attention_probabilities"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("mask", mask);
    visit.saved("probs", probs);
  }
  void backward() override {
    Tensor dscores = zeros(probs.shape(), probs);
    softmax_backward(dscores, probs.grad(), probs, mask, false);  // dS = P ⊙ (dP − Σ P·dP)
    if (q.requires_grad()) bmm(q.grad_accumulator(), dscores, k, false, false, factor, 1.0);  // dQ += dS K/√d
    if (k.requires_grad()) bmm(k.grad_accumulator(), dscores, q, true, false, factor, 1.0);   // dK += dSᵀ Q/√d
  }
};

Tensor attention_probabilities(const Tensor& q, const Tensor& k, const Tensor& mask) {
  check_ndim("attention_probabilities", q, 4, "q");
  check_ndim("attention_probabilities", k, 4, "k");
  const double factor = 1.0 / std::sqrt(static_cast<double>(q.dim(3)));
  Tensor scores = like({q.dim(0), q.dim(1), q.dim(2), k.dim(2)}, q);
  bmm(scores, q, k, false, true, factor, 0.0);
  Tensor probs = like(scores.shape(), q);
  softmax_forward(probs, scores, mask, false);
  if (autograd::needs_grad({&q, &k})) {
    auto node = std::make_unique<AttentionProbsNode>();
    node->q = q, node->k = k, node->mask = mask, node->probs = probs, node->factor = factor;
    node->outputs = {probs};
    autograd::record(std::move(node));
  }
  return probs;
}

Tensor full_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  autograd::StepScope named("full_attention");
  return matmul(attention_probabilities(q, k, mask), v);
}

}  // namespace cast::ops
