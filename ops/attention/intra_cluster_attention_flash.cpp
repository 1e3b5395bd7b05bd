#include <memory>

#include "autograd/tape.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/full_attention_flash.h"
#include "ops/rows.h"

// CAST step 5 on flash attention (the GPU's fast path): each cluster is one flash-attention
// problem. Its κ member rows of Q, K and V are gathered (an empty slot a zero row), and flash
// attention runs over them with the filled slots as the key mask, so no κ × κ matrix is stored;
// the gradients go back to the tokens by scatter-adding the gathered rows' gradients. Built on
// ops/attention/full_attention_flash.h, it runs on either device; the registry offers it for CUDA, where the
// CPU has its own tile kernel (ops/attention/intra_cluster_attention_fused.cpp).
namespace cast::ops {

namespace {
struct IntraClusterFlashNode final : autograd::Node {
  Tensor q, k, v;     // inputs (B, H, N, d)
  Tensor idx;         // members as (B·H, C·κ)
  Tensor qc, kc, vc;  // gathered rows (B·H·C, 1, κ, d)
  Tensor slots;       // (B·H·C, κ): 1 filled, 0 empty
  Tensor out, lse;    // (B·H·C, 1, κ, d) and its log-sum-exp
  const char* name() const override { return "intra_cluster_attention_flash"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("members", idx);
    visit.saved("qc", qc);
    visit.saved("kc", kc);
    visit.saved("vc", vc);
    visit.saved("slots", slots);
    visit.saved("out", out);
    visit.saved("lse", lse);
  }
  void backward() override {
    const int64_t BH = idx.dim(0), N = q.dim(2), d = q.dim(3);
    Tensor dqc = Tensor::zeros(qc.shape(), qc.dtype(), qc.device());
    Tensor dkc = Tensor::zeros(kc.shape(), kc.dtype(), kc.device());
    Tensor dvc = Tensor::zeros(vc.shape(), vc.dtype(), vc.device());
    flash_attention_backward(&dqc, &dkc, &dvc, outputs[0].grad().view(out.shape()), qc, kc, vc, slots, out, lse);
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
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3), C = members.dim(2), kappa = members.dim(3);
  Tensor idx = members.view({B * H, C * kappa});
  auto gather = [&](const Tensor& t) {
    Tensor rows = Tensor::empty({B * H, C * kappa, d}, t.dtype(), t.device());
    gather_rows_forward(rows, t.view({B * H, N, d}), idx);
    return rows.view({B * H * C, 1, kappa, d});
  };
  Tensor qc = gather(q), kc = gather(k), vc = gather(v);
  Tensor slots = slot_mask(members, {B * H * C, kappa}, q);
  Tensor out = Tensor::empty(qc.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({B * H * C, 1, kappa}, q.dtype(), q.device());
  flash_attention_forward(out, lse, qc, kc, vc, slots);
  Tensor result = out.view({B, H, C, kappa, d});
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterFlashNode>();
    node->q = q, node->k = k, node->v = v, node->idx = idx;
    node->qc = qc, node->kc = kc, node->vc = vc, node->slots = slots, node->out = out, node->lse = lse;
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
