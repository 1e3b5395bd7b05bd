// Clustered attention's steps 3–5 (ATTENTION.md §3): centroids, their attention, and its broadcast to members.
#include <cmath>
#include <vector>

#include "autograd/tape.h"
#include "autograd/trace.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/clustering.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/step_blocks.h"
#include "ops/attention/steps.h"
#include "ops/ops.h"

namespace cast::ops {
using namespace step_blocks;

// ---------------------------------------------------------------- clustered step 3
// Q̄_j = (1/|j|) Σ_{i in j} Q_i
struct CentroidsNode final : autograd::Node {
  Tensor q;           // (B, H, N, d)
  Tensor assignment;  // (B·H, N)
  Tensor inverse;     // 1/|j| (0 for an empty cluster): (B·H, C, 1)
  const char* name() const override { return "cluster_centroids"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("assignment", assignment);
    visit.saved("inverse", inverse);
  }
  void backward() override {
    const int64_t BH = assignment.dim(0), C = inverse.dim(1), d = q.dim(3);
    Tensor scaled = raw(BinaryOp::mul, outputs[0].grad().view({BH, C, d}), inverse);
    Tensor dq = grad_view(q, {BH, q.dim(2), d});
    gather_rows_forward(dq, scaled, assignment, /*accumulate=*/true);  // each member gets its centroid's share
  }
};

Tensor cluster_centroids(const Tensor& q, const Tensor& assignment, int64_t clusters) {
  autograd::StepScope named("cluster_centroids");
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3);
  Tensor assign = assignment.view({B * H, N});
  check_index_range("cluster_centroids", assign, -1, clusters);
  Tensor inverse = inverse_cluster_counts(assign, clusters, q).view({B * H, clusters, 1});
  Tensor sums = zeros({B * H, clusters, d}, q);
  gather_rows_backward(sums, q.view({B * H, N, d}), assign);  // scatter-add members into their cluster
  Tensor out = raw(BinaryOp::mul, sums, inverse).view({B, H, clusters, d});
  if (autograd::needs_grad({&q})) {
    auto node = std::make_unique<CentroidsNode>();
    node->q = q, node->assignment = assign, node->inverse = inverse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- clustered step 4
Tensor centroid_attention(const Tensor& centroids, const Tensor& k, const Tensor& mask) {
  autograd::StepScope named("centroid_attention");
  return attention_probabilities(centroids, k, mask);
}

Tensor broadcast_to_members(const Tensor& per_cluster, const Tensor& assignment) {
  autograd::StepScope named("broadcast_to_members");
  const int64_t B = per_cluster.dim(0), H = per_cluster.dim(1), C = per_cluster.dim(2), w = per_cluster.dim(3);
  const int64_t N = assignment.dim(2);
  Tensor out = gather_rows(reshape(per_cluster, {B * H, C, w}), assignment.view({B * H, N}));
  return reshape(out, {B, H, N, w});
}

}  // namespace cast::ops
