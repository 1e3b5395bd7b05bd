#pragma once
// The fast paths, and the one place that chooses between them and the reference.
//
// The step ops of ops/attention/steps.h are the reference: readable compositions of the basic ops,
// the same on every device, one file per step (ops/attention/<step>.cpp). A fast path computes
// the same function as one step op (its reference) in less time or memory, on the inputs it
// declares it supports; each is its own op in its own file named after its step
// (ops/attention/<step>_fused.cpp, _flash, _topkey), with its own node and backward, and its row
// of the table beside it. `cast info --fast-paths` prints the table.
//
// cast_attention is CAST's steps 1–3 and 5–7 as one op given the gate g (the chain of the step
// ops is its reference); where it fits, the layer runs it instead of those steps' own fast
// paths, and keeps no (B, H, N, C) or (B, H, C, κ, d) tensor for the backward.
//
// `fast_paths()` is that table; `run_step` picks the first fast path of a step that supports
// the inputs (when fast paths are on: `--reference` turns them off on every device) and falls
// back to the reference. tests/attention/fast_paths_test.cpp checks every row against its reference on
// every device and dtype, and `cast bench` and the memory estimate ask the same table.
#include <cstdint>
#include <functional>
#include <tuple>
#include <variant>
#include <vector>

#include "ops/attention/steps.h"
#include "tensor/tensor.h"

namespace cast::ops {

// The steps that have fast paths, named by their reference op, in the order of StepInputs.
enum class Step {
  cluster_affinities,
  gated_affinity,
  full_attention,
  intra_cluster_attention,
  cluster_summaries,
  combine_clusters,
  improved_clustered_output,
  cast_attention,
};
constexpr Step kSteps[] = {Step::cluster_affinities,        Step::gated_affinity,    Step::full_attention,
                           Step::intra_cluster_attention,   Step::cluster_summaries, Step::combine_clusters,
                           Step::improved_clustered_output, Step::cast_attention};
const char* step_name(Step step);

// What CAST's one-op attention takes besides its tensors.
struct CastOptions {
  AttentionFn f = AttentionFn::softmax;  // the softmax or the Laplace rows
  bool summaries = true;                 // R_inter on | off
  bool mix_query = false;                // W = A_q instead of A_g
};

// Each step's inputs, one struct per step, named after it. An undefined tensor is an absent
// optional input (no mask, summaries off). fields() lists the tensors in order, for code that
// treats every step alike (the fast-path table's test copies them to a device).
struct ClusterAffinitiesInputs {
  Tensor x;  // (B, G, N, w)
  Tensor s;  // (G, C, w)
  AttentionFn f = AttentionFn::softmax;
  auto fields() { return std::tie(x, s); }
};
struct GatedAffinityInputs {
  Tensor x;               // (B, N, D)
  Tensor gate_w, gate_b;  // (D, G), (G)
  Tensor a_q, a_k;        // (B, G, N, C)
  auto fields() { return std::tie(x, gate_w, gate_b, a_q, a_k); }
};
struct FullAttentionInputs {
  Tensor q;     // (B, H, M, d)
  Tensor k, v;  // (B, H, N, d)
  Tensor mask;  // (B, N) or undefined
  auto fields() { return std::tie(q, k, v, mask); }
};
struct IntraClusterAttentionInputs {
  Tensor q, k, v;  // (B, H, N, d)
  Tensor members;  // (B, H, C, κ) i32
  auto fields() { return std::tie(q, k, v, members); }
};
struct ClusterSummariesInputs {
  Tensor a_k;   // (B, H, N, C)
  Tensor v;     // (B, H, N, d)
  Tensor mask;  // (B, N) or undefined
  auto fields() { return std::tie(a_k, v, mask); }
};
struct CombineClustersInputs {
  Tensor w;        // (B, H, N, C)
  Tensor r_intra;  // (B, H, C, κ, d)
  Tensor r_inter;  // (B, H, C, d) or undefined
  Tensor members;  // (B, H, C, κ) i32
  auto fields() { return std::tie(w, r_intra, r_inter, members); }
};
struct ImprovedClusteredOutputInputs {
  Tensor q, k, v;     // (B, H, N, d)
  Tensor a_c;         // (B, H, C, N)
  Tensor top_keys;    // (B, H, C, k) i32
  Tensor assignment;  // (B, H, N) i32
  auto fields() { return std::tie(q, k, v, a_c, top_keys, assignment); }
};
struct CastAttentionInputs {
  Tensor g;        // (B, N, H)
  Tensor q, k, v;  // (B, H, N, d)
  Tensor s;        // (H, C, d)
  Tensor mask;     // (B, N) or undefined
  Tensor members;  // (B, H, C, κ) i32; undefined: step 4 (Top-K on A_g) runs inside the step
  CastOptions options;
  int64_t cluster_size = 0;  // κ, where the step chooses the clusters
  Tensor* chosen = nullptr;  // where the step chooses them, receives them (B, H, C, κ)
  auto fields() { return std::tie(g, q, k, v, s, mask, members); }
};
using StepInputs =
    std::variant<ClusterAffinitiesInputs, GatedAffinityInputs, FullAttentionInputs, IntraClusterAttentionInputs,
                 ClusterSummariesInputs, CombineClustersInputs, ImprovedClusteredOutputInputs, CastAttentionInputs>;
Step step_of(const StepInputs& inputs);
// The tensors of any step's inputs in order, and the same inputs with them replaced.
std::vector<Tensor> tensors_of(StepInputs inputs);
StepInputs with_tensors(StepInputs inputs, const std::vector<Tensor>& tensors);

// What a fast path's support depends on.
struct StepSizes {
  Device device = Device::cpu;
  DType dtype = DType::f32;
  int64_t head_width = 0;  // d
  int64_t top_keys = 0;    // k (improved clustered)
};
StepSizes sizes_of(const StepInputs& inputs);

// A row of the table: written beside the fast op it runs (ops/attention/<step>_<how>.cpp).
struct FastPath {
  const char* name;      // the op
  Step step;             // the reference it must equal
  const char* file;      // where it is written (its __FILE__, from the repository root)
  const char* supports;  // the inputs it takes, in words
  bool (*fits)(const StepSizes& sizes);
  std::function<Tensor(const StepInputs&)> run;
};

// A row whose run takes its step's own inputs struct.
template <class Inputs>
FastPath fast_path(const char* name, const char* file, const char* supports, bool (*fits)(const StepSizes&),
                   Tensor (*run)(const Inputs&)) {
  return {name, step_of(StepInputs(Inputs{})),
          file, supports,
          fits, [run](const StepInputs& in) { return run(std::get<Inputs>(in)); }};
}
// The supports that rows share.
inline bool cpu_float(const StepSizes& s) { return s.device == Device::cpu && is_float(s.dtype); }
inline bool cuda_f32(const StepSizes& s) { return s.device == Device::cuda && s.dtype == DType::f32; }

// The rows, each in its fast op's file; fast_paths() lists them in the order they are tried.
FastPath cluster_affinities_fused_path();
FastPath gated_affinity_fused_path();
FastPath flash_attention_path();
FastPath intra_cluster_attention_fused_path();
FastPath intra_cluster_attention_flash_path();
FastPath cluster_summaries_fused_path();
FastPath combine_clusters_fused_path();
FastPath improved_clustered_output_fused_path();
FastPath improved_clustered_output_topkey_path();
FastPath cast_attention_fused_path();
FastPath cast_attention_recompute_path();

const std::vector<FastPath>& fast_paths();
// The reference op of a step, through the same interface.
Tensor run_reference(const StepInputs& inputs);
// The fast path `run_step` takes for these sizes, or nullptr for the reference.
const FastPath* choose_path(Step step, bool fast, const StepSizes& sizes);
// Runs the step: its first fitting fast path when `fast`, else the reference.
Tensor run_step(bool fast, const StepInputs& inputs);

// ---------------------------------------------------------------- the fast ops
Tensor cluster_affinities_fused(const Tensor& x, const Tensor& s, AttentionFn f);
Tensor gated_affinity_fused(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                            const Tensor& a_k);
// flash_attention: ops/attention/full_attention_flash.h.
Tensor intra_cluster_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);
Tensor intra_cluster_attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);
Tensor cluster_summaries_fused(const Tensor& a_k, const Tensor& v, const Tensor& mask);
Tensor combine_clusters_fused(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members);
Tensor improved_clustered_output_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                       const Tensor& top_keys, const Tensor& assignment);
Tensor improved_clustered_output_topkey(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                        const Tensor& top_keys, const Tensor& assignment);
Tensor cast_attention_fused(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                            const Tensor& mask, const Tensor& members, const CastOptions& options);
// The same op with step 4 (Top-K) inside it: each group's clusters are chosen from its A_g while
// the affinities are in the op's scratch, and returned in `members` (B, H, C, κ), so the layer
// forms the affinities once in the forward. Its row runs it where the inputs give no clusters.
Tensor cast_attention_fused_topk(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                                 const Tensor& mask, int64_t kappa, const CastOptions& options, Tensor& members);

// The same steps as the chain of the steps' own fast paths, recorded on a tape of its own in the
// backward instead of the forward: keeps the clusters and its inputs only. Given no members, it
// chooses the Top-K clusters of κ tokens and returns them in *chosen (if not null).
Tensor cast_attention_recompute(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                                const Tensor& mask, const Tensor& members, int64_t kappa, const CastOptions& options,
                                Tensor* chosen);

// Input checks the fast ops share (the reference ops check as they compose).
void check_cluster_affinities_inputs(const char* op, const Tensor& x, const Tensor& s);
void check_gated_affinity_inputs(const char* op, const Tensor& x, const Tensor& gate_w, const Tensor& gate_b,
                                 const Tensor& a_q, const Tensor& a_k);
void check_intra_cluster_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& members);
void check_cast_attention_inputs(const char* op, const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& s, const Tensor& mask, const Tensor& members);
void check_improved_clustered_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& a_c, const Tensor& top_keys, const Tensor& assignment);

}  // namespace cast::ops
