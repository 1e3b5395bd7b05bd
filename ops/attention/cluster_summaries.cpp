// CAST step 6: each cluster's summary R_inter; the reference of cluster_summaries_fused.cpp.
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

// ---------------------------------------------------------------- CAST step 6
// W = A_k ⊙ m; P = W / Σ_tokens W (+1e-30); R_inter = Pᵀ V
struct SummariesNode final : autograd::Node {
  Tensor a_k, v;  // inputs (B, H, N, C), (B, H, N, d)
  Tensor mask4;   // (B, 1, N, 1) or undefined
  Tensor p;       // saved P
  Tensor colsum;  // (B, H, 1, C)
  const char* name() const override { return "cluster_summaries"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("a_k", a_k);
    visit.input("v", v);
    visit.input("mask", mask4);
    visit.saved("p", p);
    visit.saved("colsum", colsum);
  }
  void backward() override {
    const Tensor& dr = outputs[0].grad();                                             // (B, H, C, d)
    if (v.requires_grad()) bmm(v.grad_accumulator(), p, dr, false, false, 1.0, 1.0);  // dV += P dR
    if (!a_k.requires_grad()) return;
    Tensor dp = like(p.shape(), p);
    bmm(dp, v, dr, false, true, 1.0, 0.0);                                   // dP = V dRᵀ
    Tensor coldot = sum_axis_raw(raw(BinaryOp::mul, dp, p), 2);              // Σ_i dP·P per cluster
    Tensor dw = raw(BinaryOp::div, raw(BinaryOp::sub, dp, coldot), colsum);  // (dP − Σ dP·P)/ΣW
    add_into(a_k.grad_accumulator(), mask4.defined() ? raw(BinaryOp::mul, dw, mask4) : dw);
  }
};

Tensor cluster_summaries(const Tensor& a_k, const Tensor& v, const Tensor& mask) {
  autograd::StepScope named("cluster_summaries");
  const int64_t B = a_k.dim(0), H = a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
  Tensor mask4 = mask.defined() ? mask.view({B, 1, N, 1}) : Tensor();
  Tensor w = mask4.defined() ? raw(BinaryOp::mul, a_k, mask4) : a_k;
  Tensor colsum = sum_axis_raw(w, 2);
  affine_forward(colsum, colsum, 1.0, 1e-30);
  Tensor p = raw(BinaryOp::div, w, colsum);
  Tensor r = like({B, H, C, v.dim(3)}, v);
  bmm(r, p, v, true, false, 1.0, 0.0);
  if (autograd::needs_grad({&a_k, &v})) {
    auto node = std::make_unique<SummariesNode>();
    node->a_k = a_k, node->v = v, node->mask4 = mask4, node->p = p, node->colsum = colsum;
    node->outputs = {r};
    autograd::record(std::move(node));
  }
  return r;
}

}  // namespace cast::ops
