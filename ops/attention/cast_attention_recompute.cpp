// CAST steps 1–3 and 5–7 as one op on any device, built from the steps' own fast paths: the
// forward runs the chain (ops/attention/cast_chain.h) without recording it, and the backward runs
// it again, with step 4's clusters as the forward chose them, on a tape of its own
// (autograd::SeparateTape), and walks that tape back. So what the chain's steps keep for their
// backward (A_q, A_k and A_g (B, H, N, C), R_intra (B, H, C, κ, d), their row statistics) is
// alive during one layer's backward only, not from the forward to the backward of every layer;
// the node itself keeps its inputs and the clusters. It pays for that with the chain's forward
// once more in each backward (step 4 aside, whose clusters it keeps).
//
// This is the GPU's cast_attention: cast_attention_fused (its CPU twin, which forms only the
// affinities and R_intra's tiles again) runs one thread per (batch, head) group, which a GPU
// would fill with 128 groups at the Text preset's batch and never at a batch of one. The steps'
// own CUDA kernels fill it at either batch.
#include <memory>

#include "autograd/recompute.h"
#include "autograd/tape.h"
#include "ops/attention/cast_chain.h"
#include "ops/attention/fast_paths.h"

namespace cast::ops {

namespace {

// The chain with each step's first fitting fast path, as the layer runs it.
Tensor run_fast(const StepInputs& in) { return run_step(true, in); }

CastChainInputs chain_inputs(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                             const Tensor& mask, const Tensor& members, const CastOptions& options) {
  CastChainInputs in;
  in.g = g, in.q = q, in.k = k, in.v = v, in.s = s, in.mask = mask, in.members = members;
  in.options = options;
  return in;
}

struct CastAttentionRecomputeNode final : autograd::Node {
  Tensor g;              // input gate (B, N, H)
  Tensor q, k, v, s;     // inputs (B, H, N, d), surrogates (H, C, d)
  Tensor mask, members;  // (B, N) or undefined; the forward's clusters (B, H, C, κ) i32
  CastOptions options;
  const char* name() const override { return "cast_attention_recompute"; }
  // The chain formed again gives its own output; this node's is not read.
  bool backward_reads_outputs() const override { return false; }
  void fields(autograd::FieldVisitor& visit) const override {
    for (auto [name, t] : {std::pair{"g", &g}, {"q", &q}, {"k", &k}, {"v", &v}, {"s", &s}, {"mask", &mask}})
      visit.input(name, *t);
    visit.saved("members", members);
  }
  void backward() override {
    const Tensor dout = outputs[0].grad();
    autograd::SeparateTape own;
    using autograd::leaf_over, autograd::take_gradient;
    const Tensor lg = leaf_over(g), lq = leaf_over(q), lk = leaf_over(k), lv = leaf_over(v), ls = leaf_over(s);
    const Tensor out = cast_chain(chain_inputs(lg, lq, lk, lv, ls, mask, members, options), run_fast).out;
    if (!out.requires_grad()) return;  // no input that needs a gradient reaches the output
    autograd::backward(out, dout);
    take_gradient(g, lg);
    take_gradient(q, lq);
    take_gradient(k, lk);
    take_gradient(v, lv);
    take_gradient(s, ls);
  }
};

}  // namespace

Tensor cast_attention_recompute(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                                const Tensor& mask, const Tensor& members, int64_t kappa, const CastOptions& options,
                                Tensor* chosen) {
  const char* op = "cast_attention_recompute";
  CAST_CHECK(members.defined() || kappa >= 1, "{}: cluster size must be >= 1, got {}", op, kappa);
  if (members.defined()) check_cast_attention_inputs(op, g, q, k, v, s, mask, members);
  CastChain c;
  {
    autograd::NoGradGuard unrecorded;
    const ClusterChooser choose = members.defined() ? ClusterChooser() : choose_clusters(mask, kappa, false);
    c = cast_chain(chain_inputs(g, q, k, v, s, mask, members, options), run_fast, choose);
  }
  if (chosen) *chosen = c.members;
  if (autograd::needs_grad({&g, &q, &k, &v, &s})) {
    auto node = std::make_unique<CastAttentionRecomputeNode>();
    node->g = g, node->q = q, node->k = k, node->v = v, node->s = s;
    node->mask = mask, node->members = c.members;
    node->options = options;
    node->outputs = {c.out};
    autograd::record(std::move(node));
  }
  return c.out;
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath cast_attention_recompute_path() {
  return fast_path<CastAttentionInputs>(
      "cast_attention_recompute", __FILE__, "CUDA f32, per-head clustering", cuda_f32,
      [](const CastAttentionInputs& in) {
        return cast_attention_recompute(in.g, in.q, in.k, in.v, in.s, in.mask, in.members, in.cluster_size,
                                        in.options, in.chosen);
      });
}

}  // namespace cast::ops
