// CAST step 5: softmax attention inside each cluster; the reference of intra_cluster_attention_{fused,flash}.cpp.
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

// ---------------------------------------------------------------- CAST step 5
struct IntraClusterNode final : autograd::Node {
  Tensor q, k, v;     // inputs (B, H, N, d)
  Tensor members;     // (B·H, C·κ) token per slot, −1 = empty
  Tensor qc, kc, vc;  // gathered rows (B·H·C, κ, d)
  Tensor probs;       // softmax(Qc Kcᵀ/√d + slot mask): (B·H·C, κ, κ)
  Tensor slots;       // slot mask (B·H·C, κ)
  double factor;
  const char* name() const override { return "intra_cluster_attention"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("members", members);
    visit.saved("qc", qc);
    visit.saved("kc", kc);
    visit.saved("vc", vc);
    visit.saved("probs", probs);
    visit.saved("slots", slots);
  }
  void backward() override {
    const int64_t BH = members.dim(0), N = q.dim(2), d = q.dim(3);
    Tensor dout = outputs[0].grad().view(vc.shape());
    Tensor dprobs = like(probs.shape(), probs), dscores = zeros(probs.shape(), probs);
    bmm(dprobs, dout, vc, false, true, 1.0, 0.0);            // dP = dO Vcᵀ
    softmax_backward(dscores, dprobs, probs, slots, false);  // dS
    auto scatter = [&](Tensor& input, const Tensor& a, const Tensor& b, bool ta, double alpha) {
      if (!input.requires_grad()) return;
      Tensor rows = like(qc.shape(), qc);
      bmm(rows, a, b, ta, false, alpha, 0.0);
      Tensor dx = grad_view(input, {BH, N, d});
      gather_rows_backward(dx, rows.view({BH, members.dim(1), d}), members);  // back to token positions
    };
    scatter(q, dscores, kc, false, factor);  // dQc = dS Kc/√d
    scatter(k, dscores, qc, true, factor);   // dKc = dSᵀ Qc/√d
    scatter(v, probs, dout, true, 1.0);      // dVc = Pᵀ dO
  }
};

Tensor intra_cluster_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  autograd::StepScope named("intra_cluster_attention");
  check_ndim("intra_cluster_attention", members, 4, "members");
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  const int64_t C = members.dim(2), kappa = members.dim(3);
  CAST_CHECK(members.dim(0) == B && members.dim(1) == H, "intra_cluster_attention: members {} do not fit q {}",
             members.describe(), q.describe());
  Tensor idx = members.view({B * H, C * kappa});
  auto gather = [&](const Tensor& t) {
    Tensor rows = like({B * H, C * kappa, d}, t);
    gather_rows_forward(rows, t.view({B * H, N, d}), idx);
    return rows.view({B * H * C, kappa, d});
  };
  Tensor qc = gather(q), kc = gather(k), vc = gather(v);
  const double factor = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor scores = like({B * H * C, kappa, kappa}, q), probs = like(scores.shape(), q);
  bmm(scores, qc, kc, false, true, factor, 0.0);
  Tensor slots = slot_mask(members, {B * H * C, kappa}, q);
  softmax_forward(probs, scores, slots, false);
  Tensor out = like({B * H * C, kappa, d}, q);
  bmm(out, probs, vc, false, false, 1.0, 0.0);
  out = out.view({B, H, C, kappa, d});
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterNode>();
    node->q = q, node->k = k, node->v = v, node->members = idx;
    node->qc = qc, node->kc = kc, node->vc = vc, node->probs = probs, node->slots = slots, node->factor = factor;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
