// CAST step 7: each token's output from its clusters; the reference of combine_clusters_fused.cpp.
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

// ---------------------------------------------------------------- CAST step 7
// O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c])
struct CombineNode final : autograd::Node {
  Tensor w, r_intra, r_inter;  // inputs; r_inter undefined with summaries off
  Tensor members;              // (B·H, C·κ) token per slot
  Tensor weight_index;         // (B·H, C·κ) position of W[i, c] in W viewed as (B·H, N·C)
  Tensor w_slot;               // saved W[I_c[p], c]: (B·H, C, κ, 1)
  Tensor diff;                 // saved R_intra − R_inter (or R_intra): (B·H, C, κ, d)
  const char* name() const override { return "combine_clusters"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("w", w);
    visit.input("r_intra", r_intra);
    visit.input("r_inter", r_inter);
    visit.input("members", members);
    visit.saved("weight_index", weight_index);
    visit.saved("w_slot", w_slot);
    visit.saved("diff", diff);
  }
  void backward() override {
    const int64_t BH = members.dim(0), N = w.dim(2), C = w.dim(3), d = r_intra.dim(4), kappa = r_intra.dim(3);
    const Tensor& dout = outputs[0].grad();  // (B, H, N, d)
    Tensor g_slot = like({BH, C * kappa, d}, dout);
    gather_rows_forward(g_slot, dout.view({BH, N, d}), members);  // dO of each slot's token
    Tensor g4 = g_slot.view({BH, C, kappa, d});
    if (w.requires_grad()) {
      if (r_inter.defined()) bmm(w.grad_accumulator(), dout, r_inter, false, true, 1.0, 1.0);  // dW += dO R_interᵀ
      Tensor dw_slot = sum_axis_raw(raw(BinaryOp::mul, g4, diff), 3);                          // dO_i · diff
      Tensor dw = grad_view(w, {BH, N * C, 1});
      gather_rows_backward(dw, dw_slot.view({BH, C * kappa, 1}), weight_index);
    }
    Tensor ddiff = raw(BinaryOp::mul, w_slot, g4);  // W[i,c] dO_i per slot
    if (r_intra.requires_grad()) add_into(r_intra.grad_accumulator(), ddiff.view(r_intra.shape()));
    if (r_inter.defined() && r_inter.requires_grad()) {
      Tensor dr = r_inter.grad_accumulator();
      bmm(dr, w, dout, true, false, 1.0, 1.0);  // += Wᵀ dO
      Tensor dr4 = dr.view({BH, C, 1, d});
      add_into(dr4, sum_axis_raw(ddiff, 2), -1.0);  // −= Σ_p W dO
    }
  }
};

Tensor combine_clusters(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members) {
  autograd::StepScope named("combine_clusters");
  const int64_t B = w.dim(0), H = w.dim(1), N = w.dim(2), C = w.dim(3);
  const int64_t kappa = members.dim(3), d = r_intra.dim(4), BH = B * H;
  Tensor idx = members.view({BH, C * kappa});
  Tensor weight_index = member_weight_index(members, C, kappa);
  Tensor w_slot = like({BH, C * kappa, 1}, w);
  gather_rows_forward(w_slot, w.view({BH, N * C, 1}), weight_index);
  w_slot = w_slot.view({BH, C, kappa, 1});
  Tensor intra = r_intra.view({BH, C, kappa, d});
  Tensor diff = r_inter.defined() ? raw(BinaryOp::sub, intra, r_inter.view({BH, C, 1, d})) : intra;
  Tensor out = zeros({B, H, N, d}, w);
  if (r_inter.defined()) bmm(out, w, r_inter, false, false, 1.0, 0.0);  // the dense part
  Tensor out3 = out.view({BH, N, d});
  gather_rows_backward(out3, raw(BinaryOp::mul, w_slot, diff).view({BH, C * kappa, d}), idx);  // the sparse part
  if (autograd::needs_grad({&w, &r_intra, &r_inter})) {
    auto node = std::make_unique<CombineNode>();
    node->w = w, node->r_intra = r_intra, node->r_inter = r_inter, node->members = idx;
    node->weight_index = weight_index, node->w_slot = w_slot, node->diff = diff;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
