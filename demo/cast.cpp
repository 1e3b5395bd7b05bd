// `cast demo cast`: CAST, step by step (demo/walk.h).
#include "demo/walk.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/cast_chain.h"
#include "ops/attention/clustering.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::demo {

namespace {

// ================================================================ walk: CAST
struct CastForward {
  Projections p;
  Tensor s_q, s_k, a_q, a_k, a_g, members, r_intra, r_inter, o, out;
};

// nn::Attention::forward for per-head CAST with Top-K, f softmax, summaries on and W = A_g: the
// same chain of steps (ops/attention/cast_chain.h), each by its reference. Given `members`, the
// clustering is held at them (the finite-difference check).
CastForward cast_forward(const Tensor& x, const Tensor& mask, const Weights& w, const Tensor& members = Tensor()) {
  CastForward f;
  f.p = project(x, w);
  ops::CastChainInputs in;
  in.q = f.p.q, in.k = f.p.k, in.v = f.p.v, in.s = w.s, in.mask = mask;
  in.x = x, in.gate_w = w.gate_w, in.gate_b = w.gate_b, in.members = members;
  const ops::CastChain c = ops::cast_chain(in, ops::run_reference, ops::choose_clusters(mask, kClusterSize, false));
  f.a_q = c.a_q, f.a_k = c.a_k, f.a_g = c.a_g, f.members = c.members;
  f.r_intra = c.r_intra, f.r_inter = c.r_inter, f.o = c.out;
  f.out = output(f.o, w.wo, mask);
  {
    autograd::NoGradGuard display_only;  // step 1 lives inside cluster_affinities: formed here to print it
    const double factor = 1.0 / std::sqrt(static_cast<double>(kWidth));
    f.s_q = ops::surrogate_scores(f.p.q, w.s, factor);
    f.s_k = ops::surrogate_scores(f.p.k, w.s, factor);
  }
  return f;
}

// A per-slot tensor (1, H, C, κ, w) as groups per head whose rows are the slots "c0 p0", …: each
// row starts with the slot's token (− for an empty slot).
std::vector<Group> slot_groups(const std::string& name, const Tensor& per_slot, const Tensor& members) {
  const int64_t slots = kClusters * kClusterSize, w = per_slot.dim(-1);
  std::vector<Group> out = heads(name, per_slot.view({1, kHeads, slots, w}));
  const auto ids = members.to_double_vector();
  for (int64_t h = 0; h < kHeads; ++h) {
    out[h].label = fmt::format("{} head {} (token)", name, h);
    for (int64_t r = 0; r < slots; ++r) {
      const auto id = static_cast<int64_t>(ids[h * slots + r]);
      out[h].cells[r].insert(out[h].cells[r].begin(), id < 0 ? "−" : fmt::format("t{}", id));
    }
  }
  return out;
}

std::vector<std::string> slot_labels() {
  std::vector<std::string> out;
  for (int64_t c = 0; c < kClusters; ++c)
    for (int64_t p = 0; p < kClusterSize; ++p) out.push_back(fmt::format("c{} p{}", c, p));
  return out;
}

// A (1, N, H) tensor as one group whose columns are the heads.
Group token_by_head(const std::string& name, const Tensor& n_by_h) {
  return heads(name, n_by_h.view({kTokens, kHeads}))[0];
}

// Step 4 in words: the ties the rule broke, where the padding went, the empty slots. False when
// the clustering broke a rule of docs/attention.md.
bool explain_clusters(const CastForward& f, const Tensor& mask) {
  Tensor by_cluster;
  {
    autograd::NoGradGuard display_only;
    by_cluster = ops::permute(f.a_g, {0, 1, 3, 2});  // (1, H, C, N): each cluster's affinities
  }
  const bool ties_ok = show_cluster_ties(by_cluster, f.members, mask, "no tie for a cluster's last place");
  const auto ids = f.members.to_double_vector();
  const bool padding_in = std::find(ids.begin(), ids.end(), static_cast<double>(kPadded)) != ids.end();
  note(padding_in ? "t7 (padding) is in a cluster: WRONG" : "t7 (padding) is in no cluster of either head");
  const auto empty = std::count(ids.begin(), ids.end(), -1.0);
  note(empty ? fmt::format("{} empty slots hold −1", empty)
             : "no slot is empty (−1): every cluster finds κ = 4 real tokens");
  Tensor single;
  {
    autograd::NoGradGuard constant;
    single = ops::cluster_satopk(f.a_g.view({kHeads, kTokens, kClusters}), mask, kClusterSize);
  }
  const auto single_ids = single.to_double_vector();
  note("aside, cluster_satopk (--clustering satopk) on the same A_g: each real token placed once,");
  note(fmt::format("so C·κ = 8 places for 7 real tokens leave {} of the 16 slots empty, −1:",
                   std::count(single_ids.begin(), single_ids.end(), -1.0)));
  table(labels("c", kClusters), heads("I", single.view({1, kHeads, kClusters, kClusterSize}), integer));
  return ties_ok && !padding_in;
}

// Steps 1–7 and the output; false when the clustering broke a rule.
bool show_cast_forward(const CastForward& f, const Weights& w, const Tensor& x, const Tensor& mask) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  heading("step 1", "surrogate_scores", "Ŝ_q = Q Sᵀ/√d,  Ŝ_k = K Sᵀ/√d  (S: the C surrogate tokens of each head)");
  table(clusters, heads("S", w.s.view({1, kHeads, kClusters, kWidth})));
  table(tokens, heads("Ŝ_q", f.s_q) + heads("Ŝ_k", f.s_k));
  heading("step 2", "cluster_probabilities", "A_q = softmax over the clusters of Ŝ_q,  A_k likewise (f softmax)");
  table(tokens, heads("A_q", f.a_q) + heads("A_k", f.a_k));
  heading("step 3", "gated_affinity", "g = sigmoid(X W_φ + b_φ);  A_g = A_k + g ⊙ (A_q − A_k)");
  Tensor g;
  {
    autograd::NoGradGuard display_only;  // g lives inside the step: formed here only to print it
    g = ops::sigmoid(ops::add(ops::matmul(x, w.gate_w), w.gate_b));
  }
  table(tokens, std::vector<Group>{token_by_head("g (head 0, 1)", g)} + heads("A_g", f.a_g));
  heading("step 4", "cluster_topk", "I_c = the κ real tokens of largest A_g[:, c], kept in ascending order");
  table(clusters, heads("I", f.members, integer));
  const bool clusters_ok = explain_clusters(f, mask);
  heading("step 5", "intra_cluster_attention", "R_intra[c] = softmax(Q[I_c] K[I_c]ᵀ/√d + slot mask) V[I_c]");
  table(slot_labels(), slot_groups("R_intra", f.r_intra, f.members));
  heading("step 6", "cluster_summaries", "P = A_k ⊙ m normalised over the tokens;  R_inter = Pᵀ V");
  table(clusters, heads("R_inter", f.r_inter));
  heading("step 7", "combine_clusters",
          "O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c]),  W = A_g");
  table(tokens, heads("O", f.o));
  show_output(f.out);
  return clusters_ok;
}

// The backward of the CAST layer, one step at a time in reverse order; prints each gradient once
// it is complete and returns the gradients of X and the weights.
Grads cast_backward(const CastForward& f, const Weights& w, const Tensor& x, const Tensor& mask, const Tensor& d_out) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  Grads grads;
  const Tensor d_o = back_output(f.o, w, mask, d_out, grads);
  heading("back 7", "combine_clusters",
          "dW = dO R_interᵀ + slot terms;  dR_intra = W[i,c] dO_i;  dR_inter = Wᵀ dO − Σ_p W[i,c] dO_i");
  const auto d7 = step_grads(d_o, {f.a_g, f.r_intra, f.r_inter}, [&](const std::vector<Tensor>& in) {
    return ops::combine_clusters(in[0], in[1], in[2], f.members);
  });
  table(tokens, heads("dW = dA_g", d7[0]));
  table(slot_labels(), slot_groups("dR_intra", d7[1], f.members));
  table(clusters, heads("dR_inter", d7[2]));
  heading("back 6", "cluster_summaries", "dV = P dR_inter;  dA_k through P (real tokens only)");
  const auto d6 = step_grads(d7[2], {f.a_k, f.p.v},
                             [&](const std::vector<Tensor>& in) { return ops::cluster_summaries(in[0], in[1], mask); });
  note("dV and dA_k: shares, added to those of steps 5 and 3 below");
  heading("back 5", "intra_cluster_attention", "dQc = dS Kc/√d, dKc = dSᵀ Qc/√d, dVc = Pᵀ dR_intra, to the tokens");
  const auto d5 = step_grads(d7[1], {f.p.q, f.p.k, f.p.v}, [&](const std::vector<Tensor>& in) {
    return ops::intra_cluster_attention(in[0], in[1], in[2], f.members);
  });
  const Tensor dv = ops::add(d5[2], d6[1]);
  table(tokens, heads("dV (steps 5 + 6)", dv));
  heading("back 4", "cluster_topk", "no gradient: the clusters I are a constant of the backward");
  heading("back 3", "gated_affinity", "dA_q = g ⊙ dA_g;  dA_k = (1 − g) ⊙ dA_g;  dg = Σ_c dA_g ⊙ (A_q − A_k)");
  const auto d3 = step_grads(d7[0], {x, w.gate_w, w.gate_b, f.a_q, f.a_k}, [](const std::vector<Tensor>& in) {
    return ops::gated_affinity(in[0], in[1], in[2], in[3], in[4]);
  });
  const Tensor da_k = ops::add(d3[4], d6[0]);
  const Tensor dg = ops::sum(ops::mul(d7[0], ops::sub(f.a_q, f.a_k)), 3);  // (1, H, N), printed only
  table(tokens, heads("dA_q", d3[3]) + heads("dA_k (steps 3 + 6)", da_k));
  table({"head 0", "head 1"}, heads("dg (tokens t0 … t7)", dg.view({kHeads, kTokens})));
  const Tensor dw_by_head = ops::permute(d3[1], {1, 0});  // (H, D): W_φ's column for each head as a row
  table({"head 0", "head 1"},
        heads("dW_φ (column of head h, rows x0 … x7)", dw_by_head) + heads("db_φ", d3[2].view({kHeads, 1})));
  heading("back 2", "cluster_probabilities", "dŜ = A ⊙ (dA − Σ_c A·dA), for the queries and the keys");
  const StepFn softmax = [](const std::vector<Tensor>& in) {
    return ops::cluster_probabilities(in[0], ops::AttentionFn::softmax);
  };
  const auto d2q = step_grads(d3[3], {f.s_q}, softmax), d2k = step_grads(da_k, {f.s_k}, softmax);
  table(tokens, heads("dŜ_q", d2q[0]) + heads("dŜ_k", d2k[0]));
  heading("back 1", "surrogate_scores", "dQ = dŜ_q S/√d,  dK = dŜ_k S/√d,  dS = (dŜ_qᵀ Q + dŜ_kᵀ K)/√d");
  const double factor = 1.0 / std::sqrt(static_cast<double>(kWidth));
  const StepFn scores = [&](const std::vector<Tensor>& in) { return ops::surrogate_scores(in[0], in[1], factor); };
  const auto d1q = step_grads(d2q[0], {f.p.q, w.s}, scores), d1k = step_grads(d2k[0], {f.p.k, w.s}, scores);
  const Tensor dq = ops::add(d1q[0], d5[0]), dk = ops::add(d1k[0], d5[1]), ds = ops::add(d1q[1], d1k[1]);
  table(tokens, heads("dQ (steps 1 + 5)", dq));
  table(tokens, heads("dK (steps 1 + 5)", dk));
  table(clusters, heads("dS", ds.view({1, kHeads, kClusters, kWidth})));
  grads["surrogates"] = ds, grads["gate_w"] = d3[1], grads["gate_b"] = d3[2];
  back_projections(x, w, {dq, dk, dv}, d3[0], grads);
  return grads;
}

}  // namespace

int walk_cast() {
  const auto config = demo_config(nn::Mechanism::cast);
  const Weights w = layer_weights(config);
  const Tensor x = demo_input(), mask = demo_mask(), d_out = demo_dout();
  intro("cast", "one CAST attention layer, step by step (docs/attention.md §2)",
        {"C 2 clusters of κ 4, Top-K clustering, f softmax, summaries on, mixing weights W = A_g"});
  show_input(x, mask);
  CastForward f;
  {
    autograd::NoGradGuard forward_only;  // the backward below runs each step again
    f = cast_forward(x, mask, w);
  }
  show_projections(f.p);
  bool ok = show_cast_forward(f, w, x, mask);
  show_dout(d_out);
  const Grads grads = cast_backward(f, w, x, mask, d_out);

  say("");
  const LayerRun layer = run_layer(config, x, mask, d_out);
  const double forward_diff =
      std::max(difference(f.out, layer.result.out), difference(f.members, layer.result.clusters));
  ok = check("nn::Attention's forward gives the same out and clusters", forward_diff) && ok;
  ok = check_chain(grads, layer) && ok;
  note(fmt::format("the finite differences hold the clusters at I above, as the backward does (±ε on t{} or t{}",
                   kOriginal, kTwin));
  note("alone would break their tie)");
  const auto whole = [&](const std::vector<Tensor>& in) {
    return cast_forward(in[0], mask, from_inputs(in), f.members).out;
  };
  return check_finite_differences(as_inputs(x, w), "X, W_q, W_k, W_v, W_o, S, W_φ, b_φ", whole) && ok ? 0 : 1;
}

}  // namespace cast::demo
