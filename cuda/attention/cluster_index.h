#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// The index bookkeeping of the clustered ops, kept on the device (each mirrors a host loop in
// the step ops of ops/attention/). Out-of-range ids are skipped here; the ops' deferred range checks report them.
// weight_index (BH, C·κ) i32 = member · C + cluster, or −1 for an empty slot; members (BH, C, κ).
void member_weight_index(Tensor& weight_index, const Tensor& members, int64_t clusters, int64_t kappa);
// counts (G, C) = members of each cluster, assignment (G, N) i32 (−1 = none); with `inverse`,
// 1/count instead (0 for an empty cluster), computed in double as the host does.
void cluster_counts(Tensor& counts, const Tensor& assignment, int64_t clusters, bool inverse);
// Improved clustered attention: slots (BH·N, top) = 1 where query i's cluster's top-key slot holds
// a key, else 0; clear_top_keys sets outside (BH·C, N) to 0 at each cluster's top keys (the
// caller fills it with 1 first).
void top_key_slots(Tensor& slots, const Tensor& top_keys, const Tensor& assignment, int64_t clusters, int64_t n,
                   int64_t top);
void clear_top_keys(Tensor& outside, const Tensor& top_keys, int64_t n, int64_t top);
// out (B, H, E) = in (B, E) repeated for each of H heads (i32).
void repeat_heads(Tensor& out, const Tensor& in, int64_t heads);
}  // namespace cast::cuda
