#include "nn/attention.h"

#include <algorithm>
#include <cmath>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/attention/cast_chain.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/head_projections.h"
#include "ops/ops.h"

namespace cast::nn {

Mechanism parse_mechanism(const std::string& name) {
  if (name == "full") return Mechanism::full;
  if (name == "cast") return Mechanism::cast;
  if (name == "clustered") return Mechanism::clustered;
  if (name == "iclustered") return Mechanism::iclustered;
  throw Error(fmt::format("attention: unknown mechanism '{}' (full, cast, clustered, iclustered)", name));
}

const char* mechanism_name(Mechanism m) {
  switch (m) {
    case Mechanism::full: return "full";
    case Mechanism::cast: return "cast";
    case Mechanism::clustered: return "clustered";
    case Mechanism::iclustered: return "iclustered";
  }
  throw Error(fmt::format("attention: no mechanism {}", static_cast<int>(m)));
}

int64_t default_clusters_unheld(int64_t n) {
  const int64_t c = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)))));
  return (c + 7) / 8 * 8;
}

int64_t default_clusters(int64_t n) {
  return std::min(default_clusters_unheld(n), std::max<int64_t>(n, 1));  // never more clusters than tokens (N < 8)
}

std::vector<ops::Step> fast_path_steps(const AttentionConfig& c, Device device) {
  switch (c.mechanism) {
    case Mechanism::full:
    case Mechanism::clustered: return {ops::Step::full_attention};
    case Mechanism::iclustered: return {ops::Step::improved_clustered_output};
    case Mechanism::cast:
      if (cast_runs_as_one_op(c, device)) {
        if (!c.single_assignment) return {ops::Step::cast_attention};  // it chooses the Top-K clusters itself
        return {ops::Step::cluster_affinities, ops::Step::gated_affinity, ops::Step::cast_attention};
      }
      // each step once (the chain runs steps 1–2 for the queries and the keys)
      std::vector<ops::Step> steps = ops::cast_chain_steps({c.f, c.summaries, c.mix_query});
      steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
      return steps;
  }
  throw Error(fmt::format("attention: no mechanism {}", static_cast<int>(c.mechanism)));
}

bool cast_runs_as_one_op(const AttentionConfig& c, Device device, DType dtype) {
  if (c.mechanism != Mechanism::cast || c.shared_clustering) return false;
  const ops::StepSizes sizes{device, dtype, c.dim / std::max<int64_t>(c.heads, 1), 0};
  return ops::choose_path(ops::Step::cast_attention, c.fused, sizes) != nullptr;
}

std::vector<std::string> step_implementations(const AttentionConfig& c, Device device) {
  const ops::StepSizes sizes{device, DType::f32, c.dim / std::max<int64_t>(c.heads, 1), c.topk};
  std::vector<std::string> names;
  for (ops::Step s : fast_path_steps(c, device)) {
    const ops::FastPath* path = ops::choose_path(s, c.fused, sizes);
    names.push_back(path ? path->name : fmt::format("{} (reference)", ops::step_name(s)));
  }
  if (c.fused) names.insert(names.end(), {"project_heads", "merge_heads_project"});  // Attention::forward
  return names;
}

Attention::Attention(const AttentionConfig& config, DType dtype, Device device) : config_(config) {
  const int64_t D = config.dim, H = config.heads;
  CAST_CHECK(D > 0 && H > 0 && D % H == 0, "attention: dim {} must be a positive multiple of heads {}", D, H);
  const double s = 1.0 / std::sqrt(static_cast<double>(D));
  uint64_t stream = 0;
  auto init = [&](const std::string& name, const Shape& shape, double stddev) {
    Tensor t = stddev > 0 ? Tensor::normal(shape, config.seed, stream, stddev, dtype, device)
                          : Tensor::zeros(shape, dtype, device);
    stream += shape_numel(shape);
    params_[name] = t.set_requires_grad();
  };
  for (const char* name : {"wq", "wk", "wv", "wo"}) init(name, {D, D}, s);
  if (config.mechanism == Mechanism::cast) {
    CAST_CHECK(config.clusters > 0,
               "attention: CAST needs the number of clusters (set it, or use "
               "default_clusters(N))");
    const int64_t C = config.clusters, d = D / H;
    if (config.shared_clustering) {
      init("surrogates", {C, D}, 1.0);
      init("gate_w", {D, 1}, s);
      init("gate_b", {1}, 0.0);
    } else {
      init("surrogates", {H, C, d}, 1.0);
      init("gate_w", {D, H}, s);
      init("gate_b", {H}, 0.0);
    }
    // Frozen: static clustering directions, as Reformer's or SMYRF's random projections. No
    // gradient reaches them, so the optimizer leaves them as drawn (no update, no decay).
    if (config.frozen_surrogates) params_.at("surrogates").set_requires_grad(false);
  }
}

void Attention::collect_parameters(ParamList& out, const std::string& prefix) {
  for (auto& [name, t] : params_) out.push_back({join_name(prefix, name), &t});
}

// (B, N, D) -> (B, H, N, d)
static Tensor split_heads(const Tensor& t, int64_t heads) {
  const int64_t B = t.dim(0), N = t.dim(1), D = t.dim(2);
  return ops::permute(ops::reshape(t, {B, N, heads, D / heads}), {0, 2, 1, 3});
}

// (B, H, N, d) -> (B, N, D)
static Tensor merge_heads(const Tensor& t) {
  const int64_t B = t.dim(0), H = t.dim(1), N = t.dim(2), d = t.dim(3);
  return ops::reshape(ops::permute(t, {0, 2, 1, 3}), {B, N, H * d});
}

void Attention::check_input(const Tensor& x, const Tensor& mask) const {
  check_float("attention", x, "x");
  check_ndim("attention", x, 3, "x");
  CAST_CHECK(x.dim(2) == config_.dim, "attention: x {} does not have the model dim {}", x.describe(), config_.dim);
  if (mask.defined())
    CAST_CHECK(mask.shape() == (Shape{x.dim(0), x.dim(1)}) && mask.dtype() == x.dtype(),
               "attention: mask {} must be {}[{}, {}]", mask.describe(), dtype_name(x.dtype()), x.dim(0), x.dim(1));
}

AttentionOutput Attention::forward(const Tensor& x, const Tensor& mask, const Tensor& assignment) {
  check_input(x, mask);
  AttentionOutput result = attend(x, mask, assignment, Tensor());
  // With fast paths on, the heads' merge and the output projection are one node.
  if (config_.fused) {
    autograd::FastPathScope by("merge_heads_project");
    result.out = ops::merge_heads_project(result.out, params_.at("wo"));
  } else {
    result.out = ops::matmul(merge_heads(result.out), params_.at("wo"));
  }
  if (mask.defined()) result.out = ops::mul(result.out, ops::reshape(mask, {x.dim(0), x.dim(1), 1}));
  return result;
}

AttentionOutput Attention::attend(const Tensor& x, const Tensor& mask, const Tensor& assignment, const Tensor& values) {
  // With fast paths on, each projection and its split into heads is one node that keeps the heads
  // only (ops/attention/head_projections.h); the reference records the product and the permute apart.
  const bool heads_in_one_node = config_.fused;
  auto project = [&](const char* w) {
    if (!heads_in_one_node) return split_heads(ops::matmul(x, params_.at(w)), config_.heads);
    autograd::FastPathScope by("project_heads");
    return ops::project_heads(x, params_.at(w), config_.heads);
  };
  // Where one op runs CAST, the gate g (B, N, H) is its input, recorded before the projections:
  // the backward then reaches the gate after them and adds to the gradient of x they form, rather
  // than forming a (B, N, D) gradient while the heads' gradients are all alive.
  Tensor gate;
  if (cast_runs_as_one_op(config_, x.device(), x.dtype())) {
    autograd::StepScope named(ops::step_name(ops::Step::gated_affinity));  // step 3's first half
    gate = ops::cast_gate(x, params_.at("gate_w"), params_.at("gate_b"));
  }
  Tensor q = project("wq"), k = project("wk"), v = values.defined() ? values : project("wv");
  AttentionOutput result;
  Tensor heads_out;
  switch (config_.mechanism) {
    case Mechanism::full: heads_out = step(ops::FullAttentionInputs{q, k, v, mask}); break;
    case Mechanism::cast:
      result = forward_cast(x, mask, q, k, v, gate);
      heads_out = result.out;
      break;
    case Mechanism::clustered:
    case Mechanism::iclustered:
      result = forward_clustered(mask, q, k, v, assignment);
      heads_out = result.out;
      break;
  }
  ++forward_calls_;
  result.out = heads_out;
  return result;
}

Tensor Attention::weights(const Tensor& x, const Tensor& mask, const Tensor& supplied) {
  check_input(x, mask);
  autograd::NoGradGuard no_grad;
  const uint64_t calls = forward_calls_;  // a study of the weights leaves the next forward's LSH draw alone
  const int64_t B = x.dim(0), H = config_.heads, N = x.dim(1), d = config_.dim / config_.heads;
  std::vector<double> w(static_cast<size_t>(B * H * N * N), 0.0);
  Tensor assignment = supplied;  // else the first pass's, kept for the others (LSH redraws each pass)
  for (int64_t first = 0; first < N; first += d) {
    // values: columns first .. first + d − 1 of the identity, the same in every (batch, head)
    std::vector<double> eye(static_cast<size_t>(N * d), 0.0);
    for (int64_t j = first; j < std::min(N, first + d); ++j) eye[j * d + (j - first)] = 1.0;
    const Tensor values = ops::expand(ops::constant_like(eye, {1, 1, N, d}, x), {B, H, N, d});
    AttentionOutput out = attend(x, mask, assignment, values);
    if (!assignment.defined()) assignment = out.assignment;
    const std::vector<double> part = out.out.to_double_vector();  // (B, H, N, d)
    for (int64_t bhi = 0; bhi < B * H * N; ++bhi)
      for (int64_t j = first; j < std::min(N, first + d); ++j) w[bhi * N + j] = part[bhi * d + (j - first)];
  }
  forward_calls_ = calls;
  return Tensor::from_vector<double>(w, {B, H, N, N}).to(x.dtype());
}

AttentionOutput Attention::forward_cast(const Tensor& x, const Tensor& mask, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& gate) {
  const int64_t N = q.dim(2);
  // a cluster holds at most the N tokens: a larger κ would only add empty slots
  const int64_t kappa = std::min(config_.cluster_size > 0 ? config_.cluster_size : default_clusters(N), N);
  const ops::CastOptions options{config_.f, config_.summaries, config_.mix_query};
  const ops::StepRunner run = [this](const ops::StepInputs& in) { return step(in); };
  const ops::ClusterChooser choose = ops::choose_clusters(mask, kappa, config_.single_assignment);
  ops::CastChainInputs chain;
  chain.q = q, chain.k = k, chain.v = v, chain.s = params_.at("surrogates"), chain.mask = mask;
  chain.x = x, chain.gate_w = params_.at("gate_w"), chain.gate_b = params_.at("gate_b");
  chain.options = options;
  chain.shared = config_.shared_clustering;
  AttentionOutput result;
  // Where one op runs steps 1–3 and 5–7 (cast_runs_as_one_op: the gate is then given), it keeps
  // no affinities for its backward. For Top-K it also chooses the clusters, from the A_g it forms
  // anyway; for Single-Assignment Top-K, A_g is formed first without a gradient to choose them,
  // and the op forms the affinities again.
  if (gate.defined()) {
    ops::CastAttentionInputs whole{gate, q, k, v, chain.s, mask, Tensor(), options, kappa, &result.clusters};
    if (config_.single_assignment) {
      autograd::NoGradGuard choosing_clusters;
      whole.members = ops::cast_chain_to_clusters(chain, run, choose).members;
      result.clusters = whole.members;
    }
    result.out = step(whole);
    return result;
  }
  const ops::CastChain c = ops::cast_chain(chain, run, choose);
  result.out = c.out;
  result.clusters = c.members;
  return result;
}

AttentionOutput Attention::forward_clustered(const Tensor& mask, const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& supplied) {
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  Tensor assignment;
  int64_t C = config_.clusters > 0 ? config_.clusters : default_clusters(N);
  if (supplied.defined()) {
    check_dtype("attention", supplied, DType::i32, "assignment");
    CAST_CHECK(supplied.shape() == (Shape{B, H, N}), "attention: assignment {} must be [{}, {}, {}]",
               supplied.describe(), B, H, N);
    assignment = supplied.to(q.device());
    int64_t most = -1;
    for (double a : assignment.to_double_vector()) {
      CAST_CHECK(a >= -1, "attention: assignment holds {}; ids are -1 (no cluster) or 0 and up", a);
      most = std::max<int64_t>(most, static_cast<int64_t>(a));
    }
    // Without a cluster count the largest id sets it; N tokens fill at most N clusters.
    CAST_CHECK(config_.clusters > 0 || most < std::max<int64_t>(N, 1),
               "attention: assignment names cluster {} but {} tokens fill at most {} clusters (ids 0 to {})", most, N,
               N, N - 1);
    if (config_.clusters <= 0) C = most + 1;
    CAST_CHECK(most < C, "attention: assignment names cluster {} but there are {} clusters", most, C);
  } else {
    autograd::NoGradGuard constant;  // the hashes and the assignment carry no gradient
    const uint64_t draw = config_.seed * 0x9E3779B97F4A7C15ull + forward_calls_;
    Tensor planes = Tensor::normal({config_.bits, d + 1}, draw, 0, 1.0, q.dtype(), Device::cpu);
    Tensor hashes = ops::lsh_hash(q.view({B * H, N, d}), planes);
    assignment = ops::hamming_kmeans(hashes, mask, C, config_.iterations, draw).view({B, H, N});
  }
  Tensor centroids = ops::cluster_centroids(q, assignment, C);
  AttentionOutput result;
  result.assignment = assignment;
  if (config_.mechanism == Mechanism::clustered) {
    // A^c V: the same step as full attention, with the centroids as queries
    Tensor per_cluster;
    {
      autograd::StepScope named("centroid_attention");  // its name in docs/attention.md
      per_cluster = step(ops::FullAttentionInputs{centroids, k, v, mask});
    }
    result.out = ops::broadcast_to_members(per_cluster, assignment);
    return result;
  }
  Tensor a_c = ops::centroid_attention(centroids, k, mask);  // (B, H, C, N): its top keys are needed
  const int64_t top = std::min(config_.topk, N);
  Tensor top_keys;
  {
    autograd::NoGradGuard constant;
    autograd::StepScope named("topk");
    top_keys = ops::topk(a_c, top, mask);  // (B, H, C, top); masked keys never chosen
  }
  result.top_keys = top_keys;
  result.out = step(ops::ImprovedClusteredOutputInputs{q, k, v, a_c, top_keys, assignment});
  return result;
}

}  // namespace cast::nn
