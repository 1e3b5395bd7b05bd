#include "ops/attention.h"

#include <cmath>
#include <vector>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/cluster_index.h"
#include "ops/clustering.h"
#include "ops/fast.h"
#include "ops/ops.h"

namespace cast::ops {

// ---------------------------------------------------------------- helpers
Tensor constant_like(const std::vector<double>& values, const Shape& shape, const Tensor& like) {
  return Tensor::from_vector<double>(values, shape).to(like.dtype()).to(like.device());
}

Tensor expand(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return add(x, Tensor::zeros(shape, x.dtype(), x.device()));
}

// ---------------------------------------------------------------- raw building blocks
// Inside a step's forward and backward only the primitive pair functions run (nothing is
// recorded), so each step is exactly one node on the tape with its own backward.
namespace {

Tensor like(const Shape& shape, const Tensor& t) { return Tensor::empty(shape, t.dtype(), t.device()); }
Tensor zeros(const Shape& shape, const Tensor& t) { return Tensor::zeros(shape, t.dtype(), t.device()); }

// a op b with broadcasting, not recorded
Tensor raw(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = like(broadcast_shapes("attention", a.shape(), b.shape()), a);
  binary_forward(out, op, a, b);
  return out;
}

// c = alpha · op(a) op(b) + beta · c over matching leading batch dims
void bmm(Tensor c, const Tensor& a, const Tensor& b, bool ta, bool tb, double alpha, double beta) {
  gemm(c, a, b, ta, tb, alpha, beta, matmul_shape(a, b, ta, tb));
}

// The gradient buffer of t viewed with another shape (writes land in t's gradient).
Tensor grad_view(Tensor& t, const Shape& shape) { return t.grad_accumulator().view(shape); }

}  // namespace

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

// ---------------------------------------------------------------- CAST step 1
// The surrogates are shared by the batch: repeated for each batch row, so that each product is
// one batched call over (b, g), and their gradient summed back over the rows.
struct SurrogateScoresNode final : autograd::Node {
  Tensor q;           // (B, G, N, w)
  Tensor s;           // (G, C, w)
  Tensor s_repeated;  // (B, G, C, w)
  double factor;
  const char* name() const override { return "surrogate_scores"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("s", s);
    visit.saved("s_repeated", s_repeated);
  }
  void backward() override {
    const Tensor& dscores = outputs[0].grad();                                                         // (B, G, N, C)
    if (q.requires_grad()) bmm(q.grad_accumulator(), dscores, s_repeated, false, false, factor, 1.0);  // dQ += dS S/√w
    if (s.requires_grad()) {
      Tensor ds = s.grad_accumulator();
      gemm_sum_over_batch(ds, dscores, q, true, false, factor);  // dS += Σ_b dScores_bᵀ Q_b/√w
    }
  }
};

Tensor surrogate_scores(const Tensor& q, const Tensor& s, double factor) {
  autograd::StepScope named("surrogate_scores");
  check_ndim("surrogate_scores", q, 4, "q");
  check_ndim("surrogate_scores", s, 3, "surrogates");
  CAST_CHECK(s.dim(0) == q.dim(1) && s.dim(2) == q.dim(3), "surrogate_scores: surrogates {} do not fit q {}",
             s.describe(), q.describe());
  Tensor scores = like({q.dim(0), q.dim(1), q.dim(2), s.dim(1)}, q);
  Tensor s_repeated = raw(BinaryOp::add, s, zeros({q.dim(0), 1, 1, 1}, s));  // (B, G, C, w)
  bmm(scores, q, s_repeated, false, true, factor, 0.0);
  if (autograd::needs_grad({&q, &s})) {
    auto node = std::make_unique<SurrogateScoresNode>();
    node->q = q, node->s = s, node->s_repeated = s_repeated, node->factor = factor;
    node->outputs = {scores};
    autograd::record(std::move(node));
  }
  return scores;
}

// ---------------------------------------------------------------- CAST step 2
// Laplace rows: u = f(x), A = u / (Σ u + 1e-30).
struct LaplaceRowsNode final : autograd::Node {
  Tensor x;      // input scores
  Tensor u;      // f(x), for f'
  Tensor total;  // row sums (…, 1)
  Tensor a;      // saved output
  const char* name() const override { return "laplace_rows"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.saved("u", u);
    visit.saved("total", total);
    visit.saved("a", a);
  }
  void backward() override {
    const Tensor& da = a.grad();
    Tensor rowdot = sum_axis_raw(raw(BinaryOp::mul, da, a), -1);            // Σ_c dA·A
    Tensor du = raw(BinaryOp::div, raw(BinaryOp::sub, da, rowdot), total);  // (dA − Σ dA·A)/Σu
    Tensor dx = x.grad_accumulator();
    unary_backward(dx, UnaryOp::laplace, du, x, u);  // dx += du ⊙ f'(x)
  }
};

Tensor cluster_probabilities(const Tensor& scores, AttentionFn f) {
  autograd::StepScope named("cluster_probabilities");
  if (f == AttentionFn::softmax) return softmax(scores);
  check_float("cluster_probabilities", scores, "scores");
  Tensor u = like(scores.shape(), scores);
  unary_forward(u, UnaryOp::laplace, scores);
  // Rows whose every score lies far below μ underflow to 0; the floor keeps them finite (zeros).
  Tensor total = sum_axis_raw(u, -1);
  affine_forward(total, total, 1.0, 1e-30);
  Tensor a = raw(BinaryOp::div, u, total);
  if (autograd::needs_grad({&scores})) {
    auto node = std::make_unique<LaplaceRowsNode>();
    node->x = scores, node->u = u, node->total = total, node->a = a;
    node->outputs = {a};
    autograd::record(std::move(node));
  }
  return a;
}

// ---------------------------------------------------------------- CAST steps 1–2 together
Tensor cluster_affinities(const Tensor& x, const Tensor& s, AttentionFn f) {
  autograd::StepScope named("cluster_affinities");
  check_cluster_affinities_inputs("cluster_affinities", x, s);
  return cluster_probabilities(surrogate_scores(x, s, 1.0 / std::sqrt(static_cast<double>(x.dim(3)))), f);
}

// ---------------------------------------------------------------- CAST step 3
// A_g = A_k + g ⊙ (A_q − A_k)
struct AffinityMixNode final : autograd::Node {
  Tensor g;         // (B, G, N, 1)
  Tensor a_q, a_k;  // (B, G, N, C)
  Tensor diff;      // saved A_q − A_k
  const char* name() const override { return "affinity_mix"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("g", g);
    visit.input("a_q", a_q);
    visit.input("a_k", a_k);
    visit.saved("diff", diff);
  }
  void backward() override {
    const Tensor& da = outputs[0].grad();
    if (g.requires_grad()) add_into(g.grad_accumulator(), sum_axis_raw(raw(BinaryOp::mul, da, diff), -1));
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
    node->g = g4, node->a_q = a_q, node->a_k = a_k, node->diff = diff;
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

// ---------------------------------------------------------------- CAST steps 1–3, 5–7
Tensor cast_attention(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                      const Tensor& mask, const Tensor& members, AttentionFn f, bool summaries, bool mix_query) {
  check_cast_attention_inputs("cast_attention", g, q, k, v, s, mask, members);
  Tensor a_q = cluster_affinities(q, s, f);  // (B, H, N, C)
  Tensor a_k = cluster_affinities(k, s, f);
  Tensor w = a_q;
  if (!mix_query) {
    autograd::StepScope named("gated_affinity");
    w = mix_affinities(g, a_q, a_k);
  }
  Tensor r_intra = intra_cluster_attention(q, k, v, members);
  Tensor r_inter = summaries ? cluster_summaries(a_k, v, mask) : Tensor();
  return combine_clusters(w, r_intra, r_inter, members);
}

// ---------------------------------------------------------------- clustered step 3
// Q̄_j = (1/|j|) Σ_{i in j} Q_i
struct CentroidsNode final : autograd::Node {
  Tensor q;           // (B, H, N, d)
  Tensor assignment;  // (B·H, N)
  Tensor inverse;     // 1/|j| (0 for an empty cluster): (B·H, C, 1)
  const char* name() const override { return "cluster_centroids"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("assignment", assignment);
    visit.saved("inverse", inverse);
  }
  void backward() override {
    const int64_t BH = assignment.dim(0), C = inverse.dim(1), d = q.dim(3);
    Tensor scaled = raw(BinaryOp::mul, outputs[0].grad().view({BH, C, d}), inverse);
    Tensor dq = grad_view(q, {BH, q.dim(2), d});
    gather_rows_forward(dq, scaled, assignment, /*accumulate=*/true);  // each member gets its centroid's share
  }
};

Tensor cluster_centroids(const Tensor& q, const Tensor& assignment, int64_t clusters) {
  autograd::StepScope named("cluster_centroids");
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  Tensor assign = assignment.view({B * H, N});
  check_index_range("cluster_centroids", assign, -1, clusters);
  Tensor inverse = inverse_cluster_counts(assign, clusters, q).view({B * H, clusters, 1});
  Tensor sums = zeros({B * H, clusters, d}, q);
  gather_rows_backward(sums, q.view({B * H, N, d}), assign);  // scatter-add members into their cluster
  Tensor out = raw(BinaryOp::mul, sums, inverse).view({B, H, clusters, d});
  if (autograd::needs_grad({&q})) {
    auto node = std::make_unique<CentroidsNode>();
    node->q = q, node->assignment = assign, node->inverse = inverse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- clustered step 4
Tensor centroid_attention(const Tensor& centroids, const Tensor& k, const Tensor& mask) {
  autograd::StepScope named("centroid_attention");
  return attention_probabilities(centroids, k, mask);
}

Tensor broadcast_to_members(const Tensor& per_cluster, const Tensor& assignment) {
  autograd::StepScope named("broadcast_to_members");
  const int64_t B = per_cluster.dim(0), H = per_cluster.dim(1), C = per_cluster.dim(2), w = per_cluster.dim(3);
  const int64_t N = assignment.dim(2);
  Tensor out = gather_rows(reshape(per_cluster, {B * H, C, w}), assignment.view({B * H, N}));
  return reshape(out, {B, H, N, w});
}

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
