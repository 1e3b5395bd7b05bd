#pragma once
// The integer steps of the clustered mechanisms: which tokens go together. No gradient flows
// through them (they are constants of the backward pass). For CUDA inputs each runs on the
// device (cuda/attention/clustering.cu) and gives the CPU op's integers bit for bit: nothing goes to the host.
//
// Grouped mask convention (as softmax): inputs have G = B·heads groups; group g uses row
// g / (G / B) of the (B, N) key mask (1 = real token, 0 = padding).
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace cast::ops {

// CAST Top-K clustering (ATTENTION.md 2.4). affinity: (G, N, C) -> members (G, C, κ) i32:
// for each cluster the κ real tokens of largest affinity (ties toward the lower index, NaN
// after every number: math/topk_order.h), kept in ascending position order; −1 fills slots that real tokens cannot
// fill.
Tensor cluster_topk(const Tensor& affinity, const Tensor& mask, int64_t kappa);
// The same selection for one group on the calling thread, for a fused op that holds the group's
// affinities a (N, C) (ops/attention/cast_attention_fused.cpp): members (C, κ), filled with −1 beforehand,
// get each column's κ largest among `real`, the real tokens in position order.
template <class T>
void cluster_topk_group(const T* a, int64_t C, const std::vector<int32_t>& real, int64_t kappa, int32_t* members);

// Single-Assignment Top-K: tokens in descending order of their best affinity (ties toward the
// lower index) each take the cluster of highest affinity that still has room (ties toward the
// lower cluster); NaN ranks after every number in both orders (math/topk_order.h). Same output
// layout; with C·κ >= real tokens, every real token appears once.
Tensor cluster_satopk(const Tensor& affinity, const Tensor& mask, int64_t kappa);

// LSH of queries (clustered attention, 3.1). q: (G, N, d), planes: (bits, d + 1), the last
// column a bias -> (G, N) i64, bit b set when q·a_b + a_b0 > 0. bits <= 63.
Tensor lsh_hash(const Tensor& q, const Tensor& planes);

// Hamming k-means (3.2) -> assignment (G, N) i32, −1 for padding. Centroids start from the
// hashes of C distinct random real queries (drawn from `seed`, each group from its own stream:
// math/clustering_rules.h); each of
// `iterations` Lloyd steps assigns every query to the centroid at least Hamming distance
// (ties toward the lower index), then sets each centroid bit by majority vote of its members
// (an exact tie sets the bit to 0); an empty cluster takes the hash of a random real query.
Tensor hamming_kmeans(const Tensor& hashes, const Tensor& mask, int64_t clusters, int64_t iterations, uint64_t seed);

// Number of members of each cluster: assignment (G, N) -> (G, C) float counts (dtype given).
Tensor cluster_counts(const Tensor& assignment, int64_t clusters, DType dtype);

// ids (B, ...) i32 -> (B, heads, ...): the same ids for every head (shared clustering).
Tensor repeat_for_heads(const Tensor& ids, int64_t heads);

}  // namespace cast::ops
