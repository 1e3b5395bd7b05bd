#include "ops/clustering.h"

#include <algorithm>
#include <array>
#include <bit>
#include <numeric>
#include <vector>

#include "ops/topk_order.h"
#include "tensor/philox.h"
#ifdef CAST_WITH_CUDA
#include "cuda/clustering.h"
#endif

namespace cast::ops {

namespace {

// Host copies of the inputs as doubles, with the group -> mask-row mapping.
struct HostGroups {
  int64_t groups = 0, n = 0, width = 0, per_mask_row = 1;
  std::vector<double> values;  // (groups, n, width)
  std::vector<double> mask;    // (B, n) or empty
  bool real(int64_t g, int64_t i) const { return mask.empty() || mask[(g / per_mask_row) * n + i] != 0.0; }
};

HostGroups host_groups(const char* op, const Tensor& x, const Tensor& mask) {
  check_float(op, x, "input");
  check_ndim(op, x, 3, "input");
  HostGroups h;
  h.groups = x.dim(0);
  h.n = x.dim(1);
  h.width = x.dim(2);
  h.values = x.to_double_vector();
  if (mask.defined()) {
    check_ndim(op, mask, 2, "mask");
    CAST_CHECK(mask.dim(1) == h.n && mask.dim(0) > 0 && h.groups % mask.dim(0) == 0,
               "{}: mask {} does not fit input {}", op, mask.describe(), x.describe());
    h.per_mask_row = h.groups / mask.dim(0);
    h.mask = mask.to_double_vector();
  }
  return h;
}

Tensor to_device_i32(const std::vector<int32_t>& v, const Shape& shape, Device device) {
  return Tensor::from_vector<int32_t>(v, shape, device);
}

}  // namespace

Tensor cluster_topk(const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  CAST_CHECK(kappa >= 1, "cluster_topk: cluster size must be >= 1, got {}", kappa);
#ifdef CAST_WITH_CUDA
  if (affinity.is_cuda()) {  // selected on the device: nothing crosses to the host
    check_dtype("cluster_topk", affinity, DType::f32, "affinity");
    check_ndim("cluster_topk", affinity, 3, "affinity");
    if (mask.defined()) {
      check_dtype("cluster_topk", mask, DType::f32, "mask");
      check_ndim("cluster_topk", mask, 2, "mask");
      CAST_CHECK(mask.is_cuda() && mask.dim(1) == affinity.dim(1) && mask.dim(0) > 0 &&
                     affinity.dim(0) % mask.dim(0) == 0,
                 "cluster_topk: mask {} does not fit affinity {}", mask.describe(), affinity.describe());
    }
    Tensor out = Tensor::empty({affinity.dim(0), affinity.dim(2), kappa}, DType::i32, Device::cuda);
    cuda::cluster_topk(out, affinity, mask, kappa);
    return out;
  }
#endif
  HostGroups h = host_groups("cluster_topk", affinity, mask);
  const int64_t C = h.width;
  std::vector<int32_t> out(h.groups * C * kappa, -1);
  // Clusters are independent: one (group, cluster) per task, its affinity column copied to a
  // contiguous row first (the affinities are stored token-major, C apart).
#pragma omp parallel if (h.groups * C * h.n > 65536)
  {
    std::vector<double> column(h.n);
    std::vector<int32_t> order;
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < h.groups * C; ++task) {
      const int64_t g = task / C, c = task % C;
      order.clear();
      for (int64_t i = 0; i < h.n; ++i) {
        column[i] = h.values[(g * h.n + i) * C + c];
        if (h.real(g, i)) order.push_back(static_cast<int32_t>(i));
      }
      const int64_t take = std::min<int64_t>(kappa, order.size());
      // the order (ops/topk_order.h) is a strict total order (NaN last, ties to the earlier
      // token), so selecting
      // the first `take` (O(n)) picks exactly the set a full sort would
      if (take < static_cast<int64_t>(order.size()))
        std::nth_element(order.begin(), order.begin() + take, order.end(),
                         [&](int32_t x, int32_t y) { return ranks_before(column[x], x, column[y], y); });
      std::sort(order.begin(), order.begin() + take);  // members in position order
      std::copy(order.begin(), order.begin() + take, out.begin() + task * kappa);
    }
  }
  return to_device_i32(out, {h.groups, C, kappa}, affinity.device());
}

Tensor cluster_satopk(const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  HostGroups h = host_groups("cluster_satopk", affinity, mask);
  const int64_t C = h.width;
  CAST_CHECK(kappa >= 1, "cluster_satopk: cluster size must be >= 1, got {}", kappa);
  std::vector<int32_t> out(h.groups * C * kappa, -1);
  for (int64_t g = 0; g < h.groups; ++g) {
    auto a = [&](int64_t i, int64_t c) { return h.values[(g * h.n + i) * C + c]; };
    std::vector<int32_t> tokens;
    std::vector<double> best(h.n, 0.0);
    for (int64_t i = 0; i < h.n; ++i) {
      if (!h.real(g, i)) continue;
      tokens.push_back(static_cast<int32_t>(i));
      best[i] = a(i, 0);
      for (int64_t c = 1; c < C; ++c) best[i] = std::max(best[i], a(i, c));
    }
    std::stable_sort(tokens.begin(), tokens.end(), [&](int32_t x, int32_t y) { return best[x] > best[y]; });
    std::vector<std::vector<int32_t>> members(C);
    std::vector<int64_t> clusters_by_affinity(C);
    for (int32_t i : tokens) {
      std::iota(clusters_by_affinity.begin(), clusters_by_affinity.end(), 0);
      std::stable_sort(clusters_by_affinity.begin(), clusters_by_affinity.end(),
                       [&](int64_t x, int64_t y) { return a(i, x) > a(i, y); });
      for (int64_t c : clusters_by_affinity)
        if (static_cast<int64_t>(members[c].size()) < kappa) {
          members[c].push_back(i);
          break;
        }  // with every cluster full the token stays unassigned (only when C·κ < real tokens)
    }
    for (int64_t c = 0; c < C; ++c) {
      std::sort(members[c].begin(), members[c].end());
      std::copy(members[c].begin(), members[c].end(), out.begin() + (g * C + c) * kappa);
    }
  }
  return to_device_i32(out, {h.groups, C, kappa}, affinity.device());
}

Tensor lsh_hash(const Tensor& q, const Tensor& planes) {
  HostGroups h = host_groups("lsh_hash", q, Tensor());
  check_ndim("lsh_hash", planes, 2, "planes");
  const int64_t bits = planes.dim(0), d = h.width;
  CAST_CHECK(bits >= 1 && bits <= 63, "lsh_hash: 1..63 hash bits are supported, got {}", bits);
  CAST_CHECK(planes.dim(1) == d + 1, "lsh_hash: planes {} must be [bits, {}]", planes.describe(), d + 1);
  std::vector<double> a = planes.to_double_vector();
  std::vector<int64_t> out(h.groups * h.n, 0);
  for (int64_t r = 0; r < h.groups * h.n; ++r) {
    int64_t code = 0;
    for (int64_t b = 0; b < bits; ++b) {
      double s = a[b * (d + 1) + d];
      for (int64_t j = 0; j < d; ++j) s += h.values[r * d + j] * a[b * (d + 1) + j];
      if (s > 0) code |= int64_t(1) << b;
    }
    out[r] = code;
  }
  return Tensor::from_vector<int64_t>(out, {h.groups, h.n}, q.device());
}

Tensor hamming_kmeans(const Tensor& hashes, const Tensor& mask, int64_t clusters, int64_t iterations,
                      uint64_t seed) {
  check_dtype("hamming_kmeans", hashes, DType::i64, "hashes");
  check_ndim("hamming_kmeans", hashes, 2, "hashes");
  CAST_CHECK(clusters >= 1, "hamming_kmeans: clusters must be >= 1, got {}", clusters);
  const int64_t G = hashes.dim(0), N = hashes.dim(1);
  const Tensor host = hashes.to(Device::cpu);
  const int64_t* code = host.data<int64_t>();
  std::vector<double> m = mask.defined() ? mask.to_double_vector() : std::vector<double>();
  const int64_t per_row = mask.defined() ? G / std::max<int64_t>(1, mask.dim(0)) : 1;
  CAST_CHECK(!mask.defined() || (mask.dim(1) == N && G % mask.dim(0) == 0), "hamming_kmeans: mask {} does not fit {}",
             mask.describe(), hashes.describe());
  std::vector<int32_t> assign(G * N, -1);
  uint64_t draw = 0;  // position in the Philox stream
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> real;
    for (int64_t i = 0; i < N; ++i)
      if (m.empty() || m[(g / per_row) * N + i] != 0.0) real.push_back(i);
    if (real.empty()) continue;
    // a random permutation of the real queries (Fisher–Yates on the counter-based stream)
    std::vector<int64_t> perm = real;
    for (int64_t i = static_cast<int64_t>(perm.size()) - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(philox::uniform(seed, draw++) * (i + 1));
      std::swap(perm[i], perm[std::min(j, i)]);
    }
    std::vector<int64_t> centroid(clusters);
    for (int64_t c = 0; c < clusters; ++c) centroid[c] = code[g * N + perm[c % perm.size()]];
    auto assign_all = [&] {
      for (int64_t i : real) {
        int best = 64, arg = 0;
        for (int64_t c = 0; c < clusters; ++c) {
          int dist = std::popcount(static_cast<uint64_t>(code[g * N + i] ^ centroid[c]));
          if (dist < best) best = dist, arg = static_cast<int>(c);
        }
        assign[g * N + i] = arg;
      }
    };
    assign_all();
    for (int64_t it = 0; it < iterations; ++it) {
      std::vector<int64_t> members(clusters, 0);
      std::vector<std::array<int64_t, 64>> ones(clusters);
      for (auto& o : ones) o.fill(0);
      for (int64_t i : real) {
        const int32_t c = assign[g * N + i];
        ++members[c];
        for (int b = 0; b < 64; ++b) ones[c][b] += (code[g * N + i] >> b) & 1;
      }
      for (int64_t c = 0; c < clusters; ++c) {
        if (members[c] == 0) {
          int64_t pick = real[std::min<int64_t>(static_cast<int64_t>(philox::uniform(seed, draw++) * real.size()),
                                                static_cast<int64_t>(real.size()) - 1)];
          centroid[c] = code[g * N + pick];
          continue;
        }
        // majority vote; an exact tie sets the bit to 0 (the authors' rule)
        int64_t next = 0;
        for (int b = 0; b < 64; ++b)
          if (2 * ones[c][b] > members[c]) next |= int64_t(1) << b;
        centroid[c] = next;
      }
      assign_all();
    }
  }
  return to_device_i32(assign, {G, N}, hashes.device());
}

Tensor cluster_counts(const Tensor& assignment, int64_t clusters, DType dtype) {
  check_dtype("cluster_counts", assignment, DType::i32, "assignment");
  check_ndim("cluster_counts", assignment, 2, "assignment");
  const int64_t G = assignment.dim(0), N = assignment.dim(1);
  const Tensor host = assignment.to(Device::cpu);
  std::vector<double> counts(G * clusters, 0.0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = 0; i < N; ++i) {
      const int32_t c = host.data<int32_t>()[g * N + i];
      CAST_CHECK(c >= -1 && c < clusters, "cluster_counts: assignment {} outside [-1, {})", c, clusters);
      if (c >= 0) counts[g * clusters + c] += 1;
    }
  Tensor t = Tensor::from_vector<double>(counts, {G, clusters}).to(dtype);
  return t.to(assignment.device());
}

}  // namespace cast::ops
