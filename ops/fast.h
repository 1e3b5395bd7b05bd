#pragma once
// The fast paths, and the one place that chooses between them and the reference.
//
// The step ops of ops/attention.h are the reference: readable compositions of the basic ops,
// the same on every device. A fast path computes the same function as one step op (its
// reference) in less time or memory, on the inputs it declares it supports; each is its own op
// in its own file, with its own node and backward:
//
//   step (reference)           fast path                          file (in ops/)                where
//   cluster_affinities         cluster_affinities_fused           cluster_affinities_fused.cpp  CPU
//   gated_affinity             gated_affinity_fused               gated_affinity_fused.cpp      CPU
//   full_attention             flash_attention                    flash_attention.cpp           CPU; CUDA f32, d ≤ 128
//   intra_cluster_attention    intra_cluster_attention_fused      intra_cluster_fused.cpp       CPU
//                              intra_cluster_attention_flash      intra_cluster_flash.cpp       CUDA f32, d ≤ 128
//   cluster_summaries          cluster_summaries_fused            summaries_fused.cpp           CPU; CUDA f32
//   combine_clusters           combine_clusters_fused             combine_fused.cpp             CPU; CUDA f32, d ≤ 128
//   improved_clustered_output  improved_clustered_output_fused    improved_clustered_fused.cpp  CPU
//                              improved_clustered_output_topkey   topkey_attention.cpp          CUDA f32, k·d fits
//   cast_attention             cast_attention_fused               cast_attention_fused.cpp      CPU
//
// cast_attention is CAST's steps 1–3 and 5–7 as one op given the gate g (the chain of the step
// ops above is its reference); where it fits, the layer runs it instead of those steps' own fast
// paths, and keeps no (B, H, N, C) or (B, H, C, κ, d) tensor for the backward.
//
// `fast_paths()` is that table; `run_step` picks the first fast path of a step that supports
// the inputs (when fast paths are on: `--reference` turns them off on every device) and falls
// back to the reference. tests/test_fast_paths.cpp checks every row against its reference on
// every device and dtype, and `cast bench` and the memory estimate ask the same table.
#include <cstdint>
#include <vector>

#include "ops/attention.h"
#include "tensor/tensor.h"

namespace cast::ops {

// The steps that have fast paths, named by their reference op. Their inputs, in order:
enum class Step {
  cluster_affinities,         // x (B, G, N, w), s (G, C, w); options.f
  gated_affinity,             // x (B, N, D), gate_w (D, G), gate_b (G), a_q, a_k (B, G, N, C)
  full_attention,             // q (B, H, M, d), k, v (B, H, N, d), mask (B, N) or undefined
  intra_cluster_attention,    // q, k, v (B, H, N, d), members (B, H, C, κ) i32
  cluster_summaries,          // a_k (B, H, N, C), v (B, H, N, d), mask (B, N) or undefined
  combine_clusters,           // w (B, H, N, C), r_intra (B, H, C, κ, d), r_inter (B, H, C, d) or undefined, members
  improved_clustered_output,  // q, k, v (B, H, N, d), a_c (B, H, C, N), top_keys (B, H, C, k), assignment (B, H, N)
  cast_attention,             // g (B, N, H), q, k, v, s (H, C, d), mask or undefined, members; options
};
constexpr Step kSteps[] = {Step::cluster_affinities,        Step::gated_affinity,    Step::full_attention,
                           Step::intra_cluster_attention,   Step::cluster_summaries, Step::combine_clusters,
                           Step::improved_clustered_output, Step::cast_attention};
const char* step_name(Step step);

// What a fast path's support depends on.
struct StepSizes {
  Device device = Device::cpu;
  DType dtype = DType::f32;
  int64_t head_width = 0;  // d
  int64_t top_keys = 0;    // k (improved clustered)
};
StepSizes sizes_of(Step step, const std::vector<Tensor>& inputs);

// What a step takes besides its tensors.
struct StepOptions {
  AttentionFn f = AttentionFn::softmax;  // cluster_affinities, cast_attention: the softmax or the Laplace rows
  bool summaries = true;                 // cast_attention: R_inter on | off
  bool mix_query = false;                // cast_attention: W = A_q instead of A_g
};

using StepFn = Tensor (*)(const std::vector<Tensor>& inputs, const StepOptions& options);

struct FastPath {
  const char* name;      // the op
  Step step;             // the reference it must equal
  const char* file;      // where it is written
  const char* supports;  // the inputs it takes, in words
  bool (*fits)(const StepSizes& sizes);
  StepFn run;
};

const std::vector<FastPath>& fast_paths();
// The reference op of a step, through the same interface.
Tensor run_reference(Step step, const std::vector<Tensor>& inputs, const StepOptions& options = {});
// The fast path `run_step` takes for these sizes, or nullptr for the reference.
const FastPath* choose_path(Step step, bool fast, const StepSizes& sizes);
// Runs the step: its first fitting fast path when `fast`, else the reference.
Tensor run_step(Step step, bool fast, const std::vector<Tensor>& inputs, const StepOptions& options = {});

// ---------------------------------------------------------------- the fast ops
Tensor cluster_affinities_fused(const Tensor& x, const Tensor& s, AttentionFn f);
Tensor gated_affinity_fused(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                            const Tensor& a_k);
// flash_attention: ops/flash_attention.h.
Tensor intra_cluster_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);
Tensor intra_cluster_attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members);
Tensor cluster_summaries_fused(const Tensor& a_k, const Tensor& v, const Tensor& mask);
Tensor combine_clusters_fused(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members);
Tensor improved_clustered_output_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                       const Tensor& top_keys, const Tensor& assignment);
Tensor improved_clustered_output_topkey(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                        const Tensor& top_keys, const Tensor& assignment);
Tensor cast_attention_fused(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                            const Tensor& mask, const Tensor& members, const StepOptions& options);
// The same op with step 4 (Top-K) inside it: each group's clusters are chosen from its A_g while
// the affinities are in the op's scratch, and returned in `members` (B, H, C, κ), so the layer
// forms the affinities once in the forward. What the layer runs for Top-K clustering.
Tensor cast_attention_fused_topk(const Tensor& g, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& s,
                                 const Tensor& mask, int64_t kappa, const StepOptions& options, Tensor& members);

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
