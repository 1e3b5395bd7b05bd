#include "ops/attention/cast_chain.h"

#include "autograd/trace.h"
#include "ops/attention/clustering.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::ops {

ClusterChooser choose_clusters(const Tensor& mask, int64_t kappa, bool single_assignment) {
  return [mask, kappa, single_assignment](const Tensor& a_g) {
    return single_assignment ? cluster_satopk(a_g, mask, kappa) : cluster_topk(a_g, mask, kappa);
  };
}

namespace {

// (B, H, N, d) -> (B, 1, N, H·d): every head's columns side by side, as the layer's merged heads
Tensor full_width(const Tensor& t) {
  const int64_t B = t.dim(0), H = t.dim(1), N = t.dim(2), d = t.dim(3);
  return reshape(permute(t, {0, 2, 1, 3}), {B, 1, N, H * d});
}

// Step 3: A_g from the gate's weights, or from the gate itself.
Tensor mixed_affinities(const CastChainInputs& in, const StepRunner& run, const Tensor& a_q, const Tensor& a_k) {
  if (!in.g.defined()) return run(GatedAffinityInputs{in.x, in.gate_w, in.gate_b, a_q, a_k});
  autograd::StepScope named("gated_affinity");
  return mix_affinities(in.g, a_q, a_k);
}

}  // namespace

CastChain cast_chain_to_clusters(const CastChainInputs& in, const StepRunner& run, const ClusterChooser& choose) {
  const int64_t B = in.q.dim(0), H = in.q.dim(1), N = in.q.dim(2);
  CastChain c;
  // Steps 1–2 on per-head (G = H) or full-width (G = 1) queries and keys; the scores are scaled
  // by 1/√ of that width.
  const Tensor qg = in.shared ? full_width(in.q) : in.q, kg = in.shared ? full_width(in.k) : in.k;
  const Tensor s = in.shared ? reshape(in.s, {1, in.s.dim(0), in.s.dim(1)}) : in.s;
  c.a_q = run(ClusterAffinitiesInputs{qg, s, in.options.f});
  c.a_k = run(ClusterAffinitiesInputs{kg, s, in.options.f});
  const int64_t G = c.a_q.dim(1), C = c.a_q.dim(3);
  // Step 3, which W = A_q needs only to choose the clusters.
  if (!in.members.defined() || !in.options.mix_query) c.a_g = mixed_affinities(in, run, c.a_q, c.a_k);
  // Step 4: an integer constant of the backward pass.
  if (in.members.defined()) {
    c.members = in.members;
    return c;
  }
  CAST_CHECK(static_cast<bool>(choose), "cast_chain: no clusters given and no rule to choose them");
  const Tensor chosen = choose(c.a_g.view({B * G, N, C}));
  const int64_t kappa = chosen.dim(2);
  // shared: one clustering for every head
  c.members = G == 1 && H > 1 ? repeat_for_heads(chosen.view({B, C, kappa}), H) : chosen.view({B, H, C, kappa});
  return c;
}

CastChain cast_chain(const CastChainInputs& in, const StepRunner& run, const ClusterChooser& choose) {
  CastChain c = cast_chain_to_clusters(in, run, choose);
  const Shape per_head = in.q.shape();
  const int64_t B = per_head[0], H = per_head[1], N = per_head[2], C = c.a_q.dim(3);
  Tensor w = in.options.mix_query ? c.a_q : c.a_g, a_k = c.a_k;
  if (c.a_q.dim(1) != H) {  // shared: the one set of weights for every head
    w = expand(w, {B, H, N, C});
    a_k = expand(a_k, {B, H, N, C});
  }
  // Steps 5–7.
  c.r_intra = run(IntraClusterAttentionInputs{in.q, in.k, in.v, c.members});
  if (in.options.summaries) c.r_inter = run(ClusterSummariesInputs{a_k, in.v, in.mask});
  c.out = run(CombineClustersInputs{w, c.r_intra, c.r_inter, c.members});
  return c;
}

std::vector<Step> cast_chain_steps(const CastOptions& options) {
  std::vector<Step> steps = {Step::cluster_affinities, Step::cluster_affinities, Step::gated_affinity,
                             Step::intra_cluster_attention};
  if (options.summaries) steps.push_back(Step::cluster_summaries);
  steps.push_back(Step::combine_clusters);
  return steps;
}

}  // namespace cast::ops
