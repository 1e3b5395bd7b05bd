#include <memory>

#include "autograd/tape.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/full_attention_flash.h"
#include "ops/rows.h"

// CAST step 5 on flash attention (the GPU's fast path): each cluster is one flash-attention
// problem. Its κ member rows of Q, K and V are gathered (an empty slot a zero row), and flash
// attention runs over them with the filled slots as the key mask, so no κ × κ matrix is stored;
// the gradients go back to the tokens by scatter-adding the gathered rows' gradients. The
// gathered rows are not kept for the backward, which gathers them again from Q, K and V (held
// as inputs anyway): three copies of C·κ rows (N rows at the usual C = κ = √N) per (batch,
// head) fewer between forward and backward, for three gathers. Built on
// ops/attention/full_attention_flash.h, it runs on either device; the registry offers it for CUDA, where the
// CPU has its own tile kernel (ops/attention/intra_cluster_attention_fused.cpp).
namespace cast::ops {

namespace {
// The member rows of q, k and v (B, H, N, d) in cluster order, idx (B·H, C·κ), as three
// (B·H·C, 1, κ, d) views of one buffer: the forward and the backward each ask the allocator for
// one block of that size, so the cached blocks a step leaves serve the next step alike.
struct Gathered {
  Tensor all, q, k, v;
};
Gathered gather_members(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& idx, const Shape& clusters) {
  const int64_t BH = idx.dim(0), N = q.dim(2), d = q.dim(3);
  Gathered g;
  g.all = Tensor::empty({3, BH, idx.dim(1), d}, q.dtype(), q.device());
  const Tensor* inputs[3] = {&q, &k, &v};
  Tensor* outputs[3] = {&g.q, &g.k, &g.v};
  for (int i = 0; i < 3; ++i) {
    Tensor rows = g.all.slice0(i);
    gather_rows_forward(rows, inputs[i]->view({BH, N, d}), idx);
    *outputs[i] = rows.view(clusters);
  }
  return g;
}

struct IntraClusterFlashNode final : autograd::Node {
  Tensor q, k, v;   // inputs (B, H, N, d)
  Tensor idx;       // members as (B·H, C·κ)
  Tensor slots;     // (B·H·C, κ): 1 filled, 0 empty
  Tensor out, lse;  // (B·H·C, 1, κ, d), the output's own storage, and its log-sum-exp
  const char* name() const override { return "intra_cluster_attention_flash"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("members", idx);
    visit.saved("slots", slots);
    visit.saved("out", out);
    visit.saved("lse", lse);
  }
  void backward() override {
    const int64_t BH = idx.dim(0), N = q.dim(2), d = q.dim(3);
    Gathered c = gather_members(q, k, v, idx, out.shape());
    Tensor grads = Tensor::zeros(c.all.shape(), c.all.dtype(), c.all.device());  // dQc, dKc, dVc
    Tensor dqc = grads.slice0(0).view(out.shape()), dkc = grads.slice0(1).view(out.shape()),
           dvc = grads.slice0(2).view(out.shape());
    flash_attention_backward(&dqc, &dkc, &dvc, outputs[0].grad().view(out.shape()), c.q, c.k, c.v, slots, out, lse);
    c = Gathered();  // gone before the scatters
    auto back = [&](Tensor& input, const Tensor& rows) {
      if (!input.requires_grad()) return;
      Tensor dx = input.grad_accumulator().view({BH, N, d});
      gather_rows_backward(dx, rows.view({BH, idx.dim(1), d}), idx);
    };
    back(q, dqc);
    back(k, dkc);
    back(v, dvc);
  }
};

Tensor gathered_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  const int64_t B = q.dim(0), H = q.dim(1), d = q.dim(3), C = members.dim(2), kappa = members.dim(3);
  Tensor idx = members.view({B * H, C * kappa});
  const Shape clusters = {B * H * C, 1, kappa, d};
  const Gathered c = gather_members(q, k, v, idx, clusters);
  const Tensor &qc = c.q, &kc = c.k, &vc = c.v;
  Tensor slots = slot_mask(members, {B * H * C, kappa}, q);
  Tensor out = Tensor::empty(qc.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({B * H * C, 1, kappa}, q.dtype(), q.device());
  flash_attention_forward(out, lse, qc, kc, vc, slots);
  Tensor result = out.view({B, H, C, kappa, d});
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterFlashNode>();
    node->q = q, node->k = k, node->v = v, node->idx = idx;
    node->slots = slots, node->out = out, node->lse = lse;
    node->outputs = {result};
    autograd::record(std::move(node));
  }
  return result;
}

}  // namespace

Tensor intra_cluster_attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  const char* op = "intra_cluster_attention_flash";
  check_intra_cluster_inputs(op, q, k, v, members);
  return gathered_flash(q, k, v, members);
}

// ---------------------------------------------------------------- its row of the fast-path table
static bool flash_fits(const StepSizes& s) { return cuda_f32(s) && s.head_width <= 128; }

FastPath intra_cluster_attention_flash_path() {
  return fast_path<IntraClusterAttentionInputs>("intra_cluster_attention_flash", __FILE__,
                                                "CUDA f32 with head width up to 128", flash_fits,
                                                [](const IntraClusterAttentionInputs& in) {
                                                  return intra_cluster_attention_flash(in.q, in.k, in.v, in.members);
                                                });
}

}  // namespace cast::ops
