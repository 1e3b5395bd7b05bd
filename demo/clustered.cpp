// `cast demo clustered` and `cast demo iclustered`: clustered and improved clustered attention, step by step
// (demo/walk.h).
#include "demo/walk.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "autograd/gradcheck.h"
#include "autograd/tape.h"
#include "nn/attention.h"
#include "ops/attention/clustering.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::demo {

namespace {

// ================================================================ walks: clustered, improved clustered
struct ClusteredForward {
  Projections p;
  Tensor planes, hashes, assignment, centroids, a_c, v_c, top_keys, o, out;
};

// nn::Attention::forward and forward_clustered: the same ops in the same order with the same
// arguments. Given `fixed`, its planes, hashes, assignment and top keys are used instead of being
// computed (the finite-difference check holds them, as the backward does).
ClusteredForward clustered_forward(const nn::AttentionConfig& c, const Tensor& x, const Tensor& mask, const Weights& w,
                                   const ClusteredForward* fixed = nullptr) {
  ClusteredForward f;
  f.p = project(x, w);
  if (fixed) {
    f.planes = fixed->planes, f.hashes = fixed->hashes, f.assignment = fixed->assignment;
  } else {
    autograd::NoGradGuard constant;
    // a layer's first forward draws its planes from (seed, forward count 0), as nn/attention.cpp does
    const uint64_t draw = c.seed * 0x9E3779B97F4A7C15ull + 0;
    f.planes = Tensor::normal({c.bits, kWidth + 1}, draw, 0, 1.0, DType::f64, Device::cpu);
    f.hashes = ops::lsh_hash(f.p.q.view({kHeads, kTokens, kWidth}), f.planes);
    f.assignment = ops::hamming_kmeans(f.hashes, mask, kClusters, c.iterations, draw).view({1, kHeads, kTokens});
  }
  f.centroids = ops::cluster_centroids(f.p.q, f.assignment, kClusters);
  if (c.mechanism == nn::Mechanism::clustered) {
    f.v_c = ops::full_attention(f.centroids, f.p.k, f.p.v, mask);  // A^c V in one step
    f.o = ops::broadcast_to_members(f.v_c, f.assignment);
  } else {
    f.a_c = ops::centroid_attention(f.centroids, f.p.k, mask);
    if (fixed) {
      f.top_keys = fixed->top_keys;
    } else {
      autograd::NoGradGuard constant;
      f.top_keys = ops::topk(f.a_c, std::min<int64_t>(c.topk, kTokens), mask);
    }
    f.o = ops::improved_clustered_output(f.p.q, f.p.k, f.p.v, f.a_c, f.top_keys, f.assignment);
  }
  f.out = output(f.o, w.wo, mask);
  return f;
}

// The hashes (H, N) as bit strings, bit 7 first, and their values.
std::vector<Group> hash_groups(const Tensor& hashes, int64_t bits) {
  const auto v = hashes.to_double_vector();
  std::vector<Group> out;
  for (int64_t h = 0; h < kHeads; ++h) {
    Group g{fmt::format("hash head {}", h), {}};
    for (int64_t i = 0; i < kTokens; ++i) {
      const auto value = static_cast<uint64_t>(v[h * kTokens + i]);
      std::string b;
      for (int64_t bit = bits - 1; bit >= 0; --bit) b += (value >> bit) & 1 ? '1' : '0';
      g.cells.push_back({b, fmt::format("= {:3}", value)});
    }
    out.push_back(g);
  }
  return out;
}

// Steps 1–3, shared by both clustered walks; false when the padded token is in a cluster.
bool show_clustering(const ClusteredForward& f, const nn::AttentionConfig& c) {
  heading("step 1", "lsh_hash", "bit b = [q·a_b + a_b0 > 0]: 8 random hyperplanes a_b with a bias a_b0");
  table(labels("a", c.bits), heads("a_b (4 weights, then the bias a_b0)", f.planes));
  table(labels("t", kTokens), hash_groups(f.hashes, c.bits));
  heading("step 2", "hamming_kmeans",
          "2 centroids from 2 random real queries' hashes, 10 Lloyd steps by Hamming distance");
  table({"head 0", "head 1"}, {Group{"cluster of t0 t1 t2 t3 t4 t5 t6 t7",
                                     heads("", f.assignment.view({kHeads, kTokens}), integer)[0].cells}});
  const auto a = f.assignment.to_double_vector();
  const bool padded_out = a[kPadded] == -1 && a[kTokens + kPadded] == -1;
  note(padded_out ? "t7 (padding) is in no cluster (−1) in either head" : "t7 (padding) is in a cluster: WRONG");
  heading("step 3", "cluster_centroids", "Q̄_j = the mean of the queries in cluster j");
  table(labels("c", kClusters), heads("Q̄", f.centroids));
  return padded_out;
}

// The two terms of the improved clustered output, in plain loops from A^c, T and the projections,
// only to print them (the op forms both inside): for a query i in cluster j,
// term 1 = m̂_j softmax(Q_i K_Tᵀ/√d) V_T and term 2 = Σ_{l ∉ T_j} A^c_jl V_l.
struct Terms {
  Tensor m_hat, first, second;  // (1, H, C, 1), (1, H, N, d), (1, H, C, d)
};
Terms improved_terms(const ClusteredForward& f) {
  const auto q = f.p.q.to_double_vector(), k = f.p.k.to_double_vector(), v = f.p.v.to_double_vector();
  const auto a_c = f.a_c.to_double_vector(), top = f.top_keys.to_double_vector(), a = f.assignment.to_double_vector();
  const int64_t T = f.top_keys.dim(3), N = kTokens, C = kClusters, d = kWidth;
  std::vector<double> m_hat(kHeads * C, 0.0), first(kHeads * N * d, 0.0), second(kHeads * C * d, 0.0);
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t j = 0; j < C; ++j) {
      const double* row = &a_c[(h * C + j) * N];
      std::vector<bool> in_top(N, false);
      for (int64_t t = 0; t < T; ++t)
        if (top[(h * C + j) * T + t] >= 0) in_top[static_cast<int64_t>(top[(h * C + j) * T + t])] = true;
      for (int64_t l = 0; l < N; ++l) {
        if (in_top[l]) m_hat[h * C + j] += row[l];
        for (int64_t e = 0; e < d && !in_top[l]; ++e) second[(h * C + j) * d + e] += row[l] * v[(h * N + l) * d + e];
      }
    }
    for (int64_t i = 0; i < N; ++i) {
      const auto j = static_cast<int64_t>(a[h * N + i]);
      if (j < 0) continue;  // padding: no cluster, output 0
      std::vector<double> s(T, -INFINITY);
      double most = -INFINITY, total = 0;
      for (int64_t t = 0; t < T; ++t) {
        const auto l = static_cast<int64_t>(top[(h * C + j) * T + t]);
        if (l < 0) continue;
        s[t] = 0;
        for (int64_t e = 0; e < d; ++e) s[t] += q[(h * N + i) * d + e] * k[(h * N + l) * d + e] / std::sqrt(double(d));
        most = std::max(most, s[t]);
      }
      for (int64_t t = 0; t < T; ++t) total += std::exp(s[t] - most);
      for (int64_t t = 0; t < T; ++t) {
        const auto l = static_cast<int64_t>(top[(h * C + j) * T + t]);
        if (l < 0) continue;
        const double weight = m_hat[h * C + j] * std::exp(s[t] - most) / total;
        for (int64_t e = 0; e < d; ++e) first[(h * N + i) * d + e] += weight * v[(h * N + l) * d + e];
      }
    }
  }
  return {Tensor::from_vector<double>(m_hat, {1, kHeads, C, 1}), Tensor::from_vector<double>(first, {1, kHeads, N, d}),
          Tensor::from_vector<double>(second, {1, kHeads, C, d})};
}

// Steps 4–5 of clustered attention.
void show_clustered_output(const ClusteredForward& f, const Tensor& mask) {
  Tensor a_c;
  {
    autograd::NoGradGuard display_only;
    a_c = ops::centroid_attention(f.centroids, f.p.k, mask);  // the probabilities full_attention forms inside
  }
  heading("step 4", "centroid_attention", "A^c = softmax(Q̄ Kᵀ/√d + key mask);  V^c = A^c V");
  table(labels("c", kClusters), heads("A^c", a_c));
  table(labels("c", kClusters), heads("V^c", f.v_c));
  note("the layer forms V^c in one step, full_attention(Q̄, K, V, m), with the centroids as queries");
  heading("step 5", "broadcast_to_members", "O_i = V^c_j for the cluster j of query i; 0 for padding");
  table(labels("t", kTokens), heads("O", f.o));
}

// Step 4 and §4 of improved clustered attention; false when the printed terms miss the op's O.
bool show_improved_output(const ClusteredForward& f, const Tensor& mask) {
  const auto clusters = labels("c", kClusters), tokens = labels("t", kTokens);
  heading("step 4", "centroid_attention", "A^c = softmax(Q̄ Kᵀ/√d + key mask)");
  table(clusters, heads("A^c", f.a_c));
  heading("step §4", "topk", "T_j = the 3 keys of largest A^c_j, never a masked one, ties toward the lower index");
  table(clusters, heads("T", f.top_keys, integer));
  bool ok = show_cluster_ties(f.a_c, f.top_keys, mask, "no tie for a cluster's last top key");
  const Terms terms = improved_terms(f);
  heading("step §4", "improved_clustered_output",
          "O_i = m̂_j softmax(Q_i K_Tᵀ/√d) V_T + Σ_{l ∉ T_j} A^c_jl V_l,  m̂_j = Σ_{l ∈ T_j} A^c_jl");
  table(clusters, heads("m̂", terms.m_hat));
  table(tokens, heads("term 1", terms.first));
  table(clusters, heads("term 2 (per cluster)", terms.second));
  table(tokens, heads("O", f.o));
  Tensor sum;
  {
    autograd::NoGradGuard display_only;
    sum = ops::add(terms.first, ops::broadcast_to_members(terms.second, f.assignment));
  }
  return check("O = term 1 + its cluster's term 2", difference(sum, f.o)) && ok;
}

// The backward of both clustered layers, one step at a time in reverse order.
Grads clustered_backward(const ClusteredForward& f, bool improved, const Weights& w, const Tensor& x,
                         const Tensor& mask, const Tensor& d_out) {
  const auto tokens = labels("t", kTokens), clusters = labels("c", kClusters);
  Grads grads;
  const Tensor d_o = back_output(f.o, w, mask, d_out, grads);
  Tensor d_centroids, dq, dk, dv;
  if (!improved) {
    heading("back 5", "broadcast_to_members", "dV^c_j = Σ_{i in cluster j} dO_i");
    const auto d5 = step_grads(
        d_o, {f.v_c}, [&](const std::vector<Tensor>& in) { return ops::broadcast_to_members(in[0], f.assignment); });
    table(clusters, heads("dV^c", d5[0]));
    heading("back 4", "full_attention (Q̄ as queries)", "dA^c = dV^c Vᵀ, dV = A^cᵀ dV^c;  dQ̄ = dS K/√d, dK = dSᵀ Q̄/√d");
    const auto d4 = step_grads(d5[0], {f.centroids, f.p.k, f.p.v}, [&](const std::vector<Tensor>& in) {
      return ops::full_attention(in[0], in[1], in[2], mask);
    });
    d_centroids = d4[0], dk = d4[1], dv = d4[2];
    table(tokens, heads("dV", dv));
  } else {
    heading("back §4", "improved_clustered_output",
            "both terms: to Q, K_T, V_T and V, and to A^c through m̂ and term 2");
    const auto d = step_grads(d_o, {f.p.q, f.p.k, f.p.v, f.a_c}, [&](const std::vector<Tensor>& in) {
      return ops::improved_clustered_output(in[0], in[1], in[2], in[3], f.top_keys, f.assignment);
    });
    table(clusters, heads("dA^c", d[3]));
    table(tokens, heads("dV", d[2]));
    heading("back §4", "topk", "no gradient: the top keys T are a constant of the backward");
    heading("back 4", "centroid_attention", "dS = A^c ⊙ (dA^c − Σ A^c·dA^c);  dQ̄ = dS K/√d,  dK = dSᵀ Q̄/√d");
    const auto d4 = step_grads(d[3], {f.centroids, f.p.k}, [&](const std::vector<Tensor>& in) {
      return ops::centroid_attention(in[0], in[1], mask);
    });
    d_centroids = d4[0], dk = ops::add(d[1], d4[1]), dq = d[0], dv = d[2];
  }
  table(clusters, heads("dQ̄", d_centroids));
  table(tokens, heads(improved ? "dK (§4 + step 4)" : "dK", dk));
  heading("back 3", "cluster_centroids", "dQ_i = dQ̄_j / |j| for each query i of cluster j");
  const auto d3 = step_grads(d_centroids, {f.p.q}, [&](const std::vector<Tensor>& in) {
    return ops::cluster_centroids(in[0], f.assignment, kClusters);
  });
  dq = improved ? ops::add(dq, d3[0]) : d3[0];
  table(tokens, heads(improved ? "dQ (§4 + step 3)" : "dQ", dq));
  heading("back 1–2", "lsh_hash, hamming_kmeans", "no gradient: the hashes and the assignment are constants");
  back_projections(x, w, {dq, dk, dv}, Tensor(), grads);
  return grads;
}

int walk_clustered_kind(nn::Mechanism mechanism) {
  const bool improved = mechanism == nn::Mechanism::iclustered;
  const auto config = demo_config(mechanism);
  const Weights w = layer_weights(config);
  const Tensor x = demo_input(), mask = demo_mask(), d_out = demo_dout();
  if (improved)
    intro("iclustered", "one improved clustered attention layer, step by step (docs/attention.md §4)",
          {"C 2 clusters, 8 hash bits, 10 Lloyd steps, the top 3 keys of each cluster"});
  else
    intro("clustered", "one clustered attention layer, step by step (docs/attention.md §3)",
          {"C 2 clusters, 8 hash bits, 10 Lloyd steps"});
  show_input(x, mask);
  ClusteredForward f;
  {
    autograd::NoGradGuard forward_only;  // the backward below runs each step again
    f = clustered_forward(config, x, mask, w);
  }
  show_projections(f.p);
  bool ok = show_clustering(f, config);
  if (improved) ok = show_improved_output(f, mask) && ok;
  else show_clustered_output(f, mask);
  show_output(f.out);
  show_dout(d_out);
  const Grads grads = clustered_backward(f, improved, w, x, mask, d_out);

  say("");
  const LayerRun layer = run_layer(config, x, mask, d_out);
  double forward_diff =
      std::max(difference(f.out, layer.result.out), difference(f.assignment, layer.result.assignment));
  if (improved) forward_diff = std::max(forward_diff, difference(f.top_keys, layer.result.top_keys));
  ok = check(improved ? "nn::Attention's forward gives the same out, assignment and top keys"
                      : "nn::Attention's forward gives the same out and assignment",
             forward_diff) &&
       ok;
  ok = check_chain(grads, layer) && ok;
  note(improved ? "the finite differences hold the assignment and the top keys as above, as the backward does"
                : "the finite differences hold the assignment as above, as the backward does");
  const auto whole = [&](const std::vector<Tensor>& in) {
    return clustered_forward(config, in[0], mask, from_inputs(in), &f).out;
  };
  return check_finite_differences(as_inputs(x, w), "X, W_q, W_k, W_v, W_o", whole) && ok ? 0 : 1;
}

}  // namespace

int walk_clustered() { return walk_clustered_kind(nn::Mechanism::clustered); }
int walk_iclustered() { return walk_clustered_kind(nn::Mechanism::iclustered); }

}  // namespace cast::demo
