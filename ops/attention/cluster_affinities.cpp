// CAST steps 1–2: the affinities of queries or keys to the surrogate tokens; the reference of
// cluster_affinities_fused.cpp.
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

}  // namespace cast::ops
