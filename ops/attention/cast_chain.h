#pragma once
// CAST's chain of steps (docs/attention.md §2), written once. The layer runs it with each step
// through the chooser (nn/attention.cpp), the reference op cast_attention with every step's
// reference, and `cast demo cast` with the references to print each result; the memory estimate
// counts what the steps of cast_chain_steps keep.
//
//   1–2  A_q, A_k = cluster_affinities(Q, S), cluster_affinities(K, S)   (B, G, N, C)
//   3    A_g = gated_affinity(x; W_φ, b_φ; A_q, A_k), or the mix with a given gate g
//   4    I = the clusters chosen from A_g (no gradient)                   (B, H, C, κ)
//   5    R_intra = intra_cluster_attention(Q, K, V, I)                    (B, H, C, κ, d)
//   6    R_inter = cluster_summaries(A_k, V, mask)                        (B, H, C, d)
//   7    O = combine_clusters(W, R_intra, R_inter, I), W = A_g (or A_q)   (B, H, N, d)
//
// G = H with per-head clustering; G = 1 with shared clustering, where steps 1–4 see the heads'
// full width (B, 1, N, H·d) and every head then takes the one clustering and the one W.
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/attention/fast_paths.h"
#include "tensor/tensor.h"

namespace cast::ops {

struct CastChainInputs {
  Tensor q, k, v;         // (B, H, N, d)
  Tensor s;               // (H, C, d) per head; (C, H·d) shared
  Tensor mask;            // (B, N) or undefined
  Tensor x;               // (B, N, D): step 3's gate g = sigmoid(x W_φ + b_φ) is formed from x, gate_w (D, G),
  Tensor gate_w, gate_b;  //   gate_b (G) ...
  Tensor g;               // ... or given, (B, N, H), per head only (then x, gate_w, gate_b are unused)
  Tensor members;         // step 4's clusters (B, H, C, κ) i32 if given; else the chooser's
  CastOptions options;
  bool shared = false;  // one clustering of the full-width queries and keys (G = 1)
};

// Every step's result.
struct CastChain {
  Tensor a_q, a_k;          // steps 1–2: (B, G, N, C)
  Tensor a_g;               // step 3 (undefined where W = A_q and the clusters were given)
  Tensor members;           // step 4: (B, H, C, κ)
  Tensor r_intra, r_inter;  // steps 5 and 6 (r_inter undefined with summaries off)
  Tensor out;               // step 7: (B, H, N, d)
};

// How a step runs: run_reference, or the chooser (run_step with fast paths on or off).
using StepRunner = std::function<Tensor(const StepInputs&)>;
// Step 4: A_g viewed as (B·G, N, C) -> members (B·G, C, κ), as cluster_topk returns them.
using ClusterChooser = std::function<Tensor(const Tensor& a_g)>;

// Top-K (or, with `single_assignment`, Single-Assignment Top-K) clusters of κ real tokens.
ClusterChooser choose_clusters(const Tensor& mask, int64_t kappa, bool single_assignment);

// Steps 1–4: the affinities and the clusters (members as given, else chosen by `choose`).
CastChain cast_chain_to_clusters(const CastChainInputs& in, const StepRunner& run, const ClusterChooser& choose);
// Steps 1–7.
CastChain cast_chain(const CastChainInputs& in, const StepRunner& run, const ClusterChooser& choose = {});

// The step ops the chain runs, in order (steps 1–2 twice: the queries', then the keys'), for the
// memory estimate and `cast info`'s list of a layer's implementations.
std::vector<Step> cast_chain_steps(const CastOptions& options);

}  // namespace cast::ops
