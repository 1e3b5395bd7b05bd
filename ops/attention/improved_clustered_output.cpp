// Improved clustered attention's output (ATTENTION.md §4); the reference of
// improved_clustered_output_{fused,topkey}.cpp.
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

// ---------------------------------------------------------------- improved clustered (§4)
// For query i in cluster j, with T = T_j the cluster's top keys:
//   O_i = m̂_j · softmax(Q_i K_Tᵀ/√d) V_T + (A^c_j ⊙ 1[l ∉ T]) V,   m̂_j = Σ_{l ∈ T} A^c_jl
struct ImprovedClusteredNode final : autograd::Node {
  Tensor q, k, v, a_c;  // inputs: (B, H, N, d) ×3 and (B, H, C, N)
  Tensor keys;          // T as (B·H, C·k); −1 = empty slot
  Tensor keys_rows;     // T as (B·H·C, k), for gathers from A^c
  Tensor assignment;    // (B·H, N)
  Tensor kt, vt;        // each query's K_T, V_T: (B·H·N, k, d)
  Tensor probs;         // softmax over T: (B·H·N, 1, k)
  Tensor slots;         // slot mask (B·H·N, k)
  Tensor top_out;       // probs · V_T: (B·H·N, 1, d)
  Tensor m_query;       // m̂ of each query's cluster: (B·H, N, 1)
  Tensor outside;       // 1[l ∉ T_j]: (B, H, C, N)
  Tensor a_rest;        // A^c ⊙ outside
  double factor;
  const char* name() const override { return "improved_clustered_output"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("a_c", a_c);
    visit.input("top_keys", keys);
    visit.input("assignment", assignment);
    visit.saved("keys_rows", keys_rows);
    visit.saved("kt", kt);
    visit.saved("vt", vt);
    visit.saved("probs", probs);
    visit.saved("slots", slots);
    visit.saved("top_out", top_out);
    visit.saved("m_query", m_query);
    visit.saved("outside", outside);
    visit.saved("a_rest", a_rest);
  }
  void backward() override {
    const int64_t BH = assignment.dim(0), N = q.dim(2), d = q.dim(3), C = a_c.dim(2), top = keys_rows.dim(1);
    const Tensor& dout = outputs[0].grad();  // (B, H, N, d)
    Tensor d3 = dout.view({BH, N, d});
    // second term: (A^c ⊙ outside) V handed to the members
    Tensor d_rest = zeros({BH, C, d}, dout);
    gather_rows_backward(d_rest, d3, assignment);
    Tensor d_rest4 = d_rest.view({a_c.dim(0), a_c.dim(1), C, d});
    if (v.requires_grad()) bmm(v.grad_accumulator(), a_rest, d_rest4, true, false, 1.0, 1.0);  // dV += A_restᵀ dR
    Tensor da_c = a_c.requires_grad() ? a_c.grad_accumulator() : Tensor();
    if (da_c.defined()) {
      Tensor da_rest = like(a_c.shape(), a_c);
      bmm(da_rest, d_rest4, v, false, true, 1.0, 0.0);  // dR Vᵀ
      add_into(da_c, raw(BinaryOp::mul, da_rest, outside));
    }
    // first term: m̂ · (P V_T)
    Tensor d_top = raw(BinaryOp::mul, d3, m_query).view(top_out.shape());  // (B·H·N, 1, d)
    if (da_c.defined()) {
      Tensor dm_query = sum_axis_raw(raw(BinaryOp::mul, d3, top_out.view({BH, N, d})), 2);  // (B·H, N, 1)
      Tensor dm_hat = zeros({BH, C, 1}, dout);
      gather_rows_backward(dm_hat, dm_query, assignment);  // to the clusters
      Tensor spread = raw(BinaryOp::add, zeros({BH * C, top, 1}, dout), dm_hat.view({BH * C, 1, 1}));
      Tensor da_rows = da_c.view({BH * C, N, 1});
      gather_rows_backward(da_rows, spread, keys_rows);  // dA^c[j, T_j] += dm̂_j
    }
    Tensor dprobs = like(probs.shape(), probs), dscores = zeros(probs.shape(), probs);
    bmm(dprobs, d_top, vt, false, true, 1.0, 0.0);  // dP = dTop V_Tᵀ
    softmax_backward(dscores, dprobs, probs, slots, false);
    if (q.requires_grad()) bmm(q.grad_accumulator().view({BH * N, 1, d}), dscores, kt, false, false, factor, 1.0);
    // dK_T, dV_T per query -> per cluster -> per key
    auto to_keys = [&](Tensor& input, const Tensor& a, const Tensor& b, double alpha) {
      if (!input.requires_grad()) return;
      Tensor per_query = like({BH * N, top, d}, a);
      bmm(per_query, a, b, true, false, alpha, 0.0);
      Tensor per_cluster = zeros({BH, C, top * d}, a);
      gather_rows_backward(per_cluster, per_query.view({BH, N, top * d}), assignment);
      Tensor dx = grad_view(input, {BH, N, d});
      gather_rows_backward(dx, per_cluster.view({BH, C * top, d}), keys);
    };
    Tensor q_rows = q.view({BH * N, 1, d});
    to_keys(k, dscores, q_rows, factor);  // dK_T = dSᵀ Q_i /√d
    to_keys(v, probs, d_top, 1.0);        // dV_T = Pᵀ dTop
  }
};

Tensor improved_clustered_output(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                 const Tensor& top_keys, const Tensor& assignment) {
  autograd::StepScope named("improved_clustered_output");
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3), BH = B * H;
  const int64_t C = a_c.dim(2), top = top_keys.dim(3);
  const double factor = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor keys = top_keys.view({BH, C * top}), keys_rows = top_keys.view({BH * C, top});
  Tensor assign = assignment.view({BH, N});
  check_index_range("improved_clustered_output", assign, -1, C);
  // m̂_j = Σ_{l ∈ T_j} A^c_jl, then the value of each query's cluster
  Tensor a_top = like({BH * C, top, 1}, a_c);
  gather_rows_forward(a_top, a_c.view({BH * C, N, 1}), keys_rows);
  Tensor m_hat = sum_axis_raw(a_top.view({BH, C, top}), 2);  // (B·H, C, 1)
  Tensor m_query = like({BH, N, 1}, q);
  gather_rows_forward(m_query, m_hat, assign);
  Tensor slots, outside_t, top_out = like({BH * N, 1, d}, q);
  top_key_masks(&slots, outside_t, top_keys, assign, a_c);
  // K_T and V_T of each cluster, handed to each member query
  auto per_query = [&](const Tensor& t) {
    Tensor cluster_rows = like({BH, C * top, d}, t);
    gather_rows_forward(cluster_rows, t.view({BH, N, d}), keys);
    Tensor rows = like({BH, N, top * d}, t);
    gather_rows_forward(rows, cluster_rows.view({BH, C, top * d}), assign);
    return rows.view({BH * N, top, d});
  };
  Tensor kt = per_query(k), vt = per_query(v);
  // query i may use slot s of its cluster's T when that slot holds a key
  Tensor scores = like({BH * N, 1, top}, q);
  Tensor probs = like(scores.shape(), q);
  bmm(scores, q.view({BH * N, 1, d}), kt, false, true, factor, 0.0);
  softmax_forward(probs, scores, slots, false);
  bmm(top_out, probs, vt, false, false, 1.0, 0.0);
  // the keys outside T keep their centroid attention weight
  Tensor a_rest = raw(BinaryOp::mul, a_c, outside_t);
  Tensor rest = like({B, H, C, d}, v);
  bmm(rest, a_rest, v, false, false, 1.0, 0.0);
  Tensor out = like({BH, N, d}, q);
  gather_rows_forward(out, rest.view({BH, C, d}), assign);
  add_into(out, raw(BinaryOp::mul, m_query, top_out.view({BH, N, d})));
  out = out.view({B, H, N, d});
  if (autograd::needs_grad({&q, &k, &v, &a_c})) {
    auto node = std::make_unique<ImprovedClusteredNode>();
    node->q = q, node->k = k, node->v = v, node->a_c = a_c, node->keys = keys, node->keys_rows = keys_rows;
    node->assignment = assign, node->kt = kt, node->vt = vt, node->probs = probs, node->slots = slots;
    node->top_out = top_out, node->m_query = m_query, node->outside = outside_t, node->a_rest = a_rest;
    node->factor = factor;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

}  // namespace cast::ops
