#pragma once
// Multi-head self-attention with a choice of mechanism, behind one config struct:
// full softmax, CAST (Top-K / Single-Assignment Top-K clustering with surrogate tokens),
// clustered and improved clustered attention. Projections have no bias (as in LRA).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/module.h"
#include "ops/attention/steps.h"
#include "ops/attention/fast_paths.h"
#include "tensor/tensor.h"

namespace cast::nn {

enum class Mechanism { full, cast, clustered, iclustered };

struct AttentionConfig {
  Mechanism mechanism = Mechanism::full;
  int64_t dim = 64;   // D
  int64_t heads = 4;  // H; D must be a multiple
  // CAST and clustered: 0 = the default ⌈√N⌉ rounded up to a multiple of 8
  int64_t clusters = 0;
  int64_t cluster_size = 0;                        // κ (CAST)
  bool single_assignment = false;                  // CAST clustering: topk | satopk
  ops::AttentionFn f = ops::AttentionFn::softmax;  // CAST f: softmax | laplace
  bool summaries = true;                           // CAST cluster summaries on | off
  bool mix_query = false;                          // CAST mixing weights: affinity (false) | query
  bool shared_clustering = false;                  // CAST clustering: per-head (false) | shared
  bool frozen_surrogates = false;                  // CAST surrogate tokens: learned (false) | frozen at init
  int64_t topk = 32;                               // improved clustered: keys per cluster
  int64_t bits = 63;                               // clustered: LSH hash bits
  int64_t iterations = 10;                         // clustered: Lloyd iterations
  uint64_t seed = 0;                               // parameter init and the LSH planes
  // The registered fast paths (ops/attention/fast_paths.h) where they support the inputs, on every device,
  // instead of the step-by-step reference ops. Same values and gradients; off for study
  // (--reference), which then runs only the reference's basic ops on the CPU and the GPU alike.
  bool fused = true;
};

// The bounds of the attention settings: cast train's settings (train/settings.cpp) and every
// command that takes them (commands/attention_options.cpp) check the same ones.
struct AttentionLimits {
  static constexpr int64_t clusters = 1 << 16;      // C: 0 (the default) to this
  static constexpr int64_t cluster_size = 1 << 22;  // κ: 0 (the default) to this
  static constexpr int64_t topk = 1 << 22;          // improved clustered keys per cluster: 1 to this
  static constexpr int64_t bits = 63;               // LSH hash bits: 1 to this
  static constexpr int64_t iterations = 100000;     // Lloyd iterations: 0 to this
};

Mechanism parse_mechanism(const std::string& name);
const char* mechanism_name(Mechanism m);
int64_t default_clusters(int64_t n);         // ⌈√N⌉ rounded up to a multiple of 8, at most N
int64_t default_clusters_unheld(int64_t n);  // the same before "at most N"
// The steps with fast paths (ops/attention/fast_paths.h) that a layer of this config runs, in order, and the
// implementation each takes on `device` for f32 inputs: a fast path's name, or the step's name
// followed by " (reference)", then the one-node head projections when fast paths are on
// (ops/attention/head_projections.h). What `cast bench` prints, from the registry the layer asks.
std::vector<ops::Step> fast_path_steps(const AttentionConfig& config, Device device = Device::cpu);
// Whether a CAST layer of this config runs steps 1–3 and 5–7 as one op (ops/attention/fast_paths.h's
// cast_attention) for inputs of this device and dtype: per-head clustering and a fast path that fits.
bool cast_runs_as_one_op(const AttentionConfig& config, Device device, DType dtype = DType::f32);
std::vector<std::string> step_implementations(const AttentionConfig& config, Device device);

struct AttentionOutput {
  Tensor out;         // (B, N, D)
  Tensor clusters;    // CAST: (B, H, C, κ) i32, −1 in empty slots (shared clustering repeats per head)
  Tensor assignment;  // clustered variants: (B, H, N) i32, −1 = no cluster
  Tensor top_keys;    // improved clustered: (B, H, C, k) i32, each cluster's top keys, −1 = none
};

class Attention : public Module {
 public:
  Attention(const AttentionConfig& config, DType dtype = DType::f32, Device device = Device::cpu);

  // x: (B, N, D); mask: (B, N) of x's dtype or undefined; assignment: (B, H, N) i32, optional,
  // replaces the computed one in the clustered variants. Padded positions output 0, so padding
  // neither contributes to nor receives any gradient.
  AttentionOutput forward(const Tensor& x, const Tensor& mask, const Tensor& assignment = Tensor());
  // How many forward passes have drawn LSH planes and k-means seeds (clustered, iclustered): each
  // pass draws from it, so a checkpoint keeps it and a resumed run or `cast eval` draws as the
  // run would have.
  uint64_t clustering_draws() const { return forward_calls_; }
  void set_clustering_draws(uint64_t draws) { forward_calls_ = draws; }

  // Each query's weights over the keys, (B, H, N, N) on the host: the heads' output when the
  // values are the identity, d columns at a time (every mechanism is linear in V; the clusters
  // of the first pass, or `assignment` when given, serve every pass). For study: `cast
  // attention` draws them.
  Tensor weights(const Tensor& x, const Tensor& mask, const Tensor& assignment = Tensor());

  // Named parameters: wq, wk, wv, wo (D, D); CAST adds surrogates, gate_w, gate_b.
  std::map<std::string, Tensor>& parameters() { return params_; }
  const AttentionConfig& config() const { return config_; }
  void collect_parameters(ParamList& out, const std::string& prefix) override;

 private:
  void check_input(const Tensor& x, const Tensor& mask) const;
  // The heads' output (B, H, N, d) before the output projection; `values` (B, H, N, d) replace
  // the projected V when given.
  AttentionOutput attend(const Tensor& x, const Tensor& mask, const Tensor& assignment, const Tensor& values);
  AttentionOutput forward_cast(const Tensor& x, const Tensor& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& gate);
  AttentionOutput forward_clustered(const Tensor& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& assignment);
  // One step through ops/attention/fast_paths.h: a fast path when the config allows and one fits, else the reference.
  Tensor step(const ops::StepInputs& inputs) const { return ops::run_step(config_.fused, inputs); }
  AttentionConfig config_;
  std::map<std::string, Tensor> params_;
  uint64_t forward_calls_ = 0;  // the LSH planes are redrawn each forward
};

}  // namespace cast::nn
