#include "ops/attention/clustering.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "autograd/trace.h"
#include "math/clustering_rules.h"
#include "ops/dispatch.h"
#include "ops/rows.h"
#include "math/topk_order.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/cluster_index.h"
#include "cuda/attention/clustering.h"
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

// A (B, N) key mask fits input x (G, N, ...) when B divides G; for a device input it is f32 and
// on the device too. One check for every op here, on either device.
void check_mask_fits(const char* op, const Tensor& mask, const Tensor& x) {
  check_ndim(op, mask, 2, "mask");
  CAST_CHECK(mask.dim(1) == x.dim(1) && mask.dim(0) > 0 && x.dim(0) % mask.dim(0) == 0 &&
                 (!x.is_cuda() || (mask.is_cuda() && mask.dtype() == DType::f32)),
             "{}: mask {} does not fit input {}", op, mask.describe(), x.describe());
}

// values_too = false: the mask only, for an op that reads x in place
HostGroups host_groups(const char* op, const Tensor& x, const Tensor& mask, bool values_too = true) {
  check_float(op, x, "input");
  check_ndim(op, x, 3, "input");
  HostGroups h;
  h.groups = x.dim(0);
  h.n = x.dim(1);
  h.width = x.dim(2);
  if (values_too) h.values = x.to_double_vector();
  if (mask.defined()) {
    check_mask_fits(op, mask, x);
    h.per_mask_row = h.groups / mask.dim(0);
    h.mask = mask.to_double_vector();
  }
  return h;
}

Tensor to_device_i32(const std::vector<int32_t>& v, const Shape& shape, Device device) {
  return Tensor::from_vector<int32_t>(v, shape, device);
}

#ifdef CAST_WITH_CUDA
// The checks of a device clustering op's f32 input and (B, N) mask.
void check_device_inputs(const char* op, const Tensor& x, const Tensor& mask) {
  check_dtype(op, x, DType::f32, "input");
  check_ndim(op, x, 3, "input");
  if (mask.defined()) check_mask_fits(op, mask, x);
}
#endif

}  // namespace

// The `take` real tokens of each column of a block that rank first in the order of
// math/topk_order.h (larger values first, NaN after every number, ties toward the earlier token),
// written to members in position order: the set a full sort picks. The take-th largest number t
// of each column is found first; its members are then every token above t and, in position
// order, as many tokens equal to t as are left (then NaNs, in position order, when the column
// has fewer numbers than take).
//
// The affinities are stored token-major, C apart, so the block's columns (up to 16: one cache
// line of a row) are read side by side in two passes over the group's rows, without a copy.
// Pass 1 keeps for each column candidates for its take largest numbers: every number above a
// bar, which starts open and, each time 2·take candidates have piled up, is raised to the
// take-th largest of them (nth_element on 2·take numbers, the other half dropped). A row is
// looked at closely only where one of its values clears its column's bar, which after the first
// few hundred rows is rare and predicted; a heap paid a sift for every such value instead.
// The bar need not start open: split the real rows into take runs, and the smallest of the runs'
// largest numbers is cleared (or met) by at least take numbers, so the take-th largest is not
// below it. That first bar costs one vectorised pass of maxima and keeps out most of the numbers
// an open bar would let in; a column with a run of no number starts open as before.
// Pass 2 writes the members.
constexpr int64_t kTopBlock = 16;

template <class T>
struct TopColumns {
  std::vector<T> candidates;       // (width, 2·take)
  std::array<T, kTopBlock> bar{};  // NaN while open: every number is a candidate
  std::array<int64_t, kTopBlock> kept{}, nans{};
};

// bar[c] just below min over take runs of real rows of each run's largest number in column c,
// where that is a number above −∞ (NaN is no number: x > m is false). Left open otherwise, and
// where the runs would be too short to keep much out.
template <class T>
void first_bar(const T* rows, int64_t C, int64_t width, const std::vector<int32_t>& real, int64_t take,
               std::array<T, kTopBlock>& bar) {
  const int64_t n = static_cast<int64_t>(real.size());
  if (n < 4 * take) return;
  constexpr T kLowest = -std::numeric_limits<T>::infinity();
  std::array<T, kTopBlock> smallest_max;
  smallest_max.fill(std::numeric_limits<T>::infinity());
  for (int64_t run = 0; run < take; ++run) {
    std::array<T, kTopBlock> m;
    m.fill(kLowest);
    for (int64_t r = run * n / take, end = (run + 1) * n / take; r < end; ++r) {
      const T* row = rows + static_cast<int64_t>(real[r]) * C;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) m[c] = row[c] > m[c] ? row[c] : m[c];
    }
    for (int64_t c = 0; c < width; ++c) smallest_max[c] = std::min(smallest_max[c], m[c]);
  }
  for (int64_t c = 0; c < width; ++c)  // x > the next number below ⟺ x ≥ the smallest maximum
    if (smallest_max[c] > kLowest) bar[c] = std::nextafter(smallest_max[c], kLowest);
}

template <class T>
void select_top_block(const T* rows, int64_t C, int64_t width, const std::vector<int32_t>& real, int64_t take,
                      int64_t kappa, TopColumns<T>& st, int32_t* members) {
  if (take == 0) return;
  st.candidates.resize(width * 2 * take);
  for (int64_t c = 0; c < width; ++c) st.bar[c] = std::numeric_limits<T>::quiet_NaN(), st.kept[c] = st.nans[c] = 0;
  first_bar(rows, C, width, real, take, st.bar);
  for (int32_t i : real) {
    const T* row = rows + i * C;
    uint32_t look = 0;  // the columns whose value clears the bar or is NaN: a mask without branches
    for (int64_t c = 0; c < width; ++c) look |= static_cast<uint32_t>(!(row[c] <= st.bar[c])) << c;
    for (; look != 0; look &= look - 1) {
      const int c = std::countr_zero(look);
      const T x = row[c];
      if (x != x) {
        ++st.nans[c];
      } else {
        T* cand = st.candidates.data() + c * 2 * take;
        cand[st.kept[c]++] = x;
        if (st.kept[c] == 2 * take) {
          std::nth_element(cand, cand + take - 1, cand + 2 * take, std::greater<T>());
          st.bar[c] = cand[take - 1], st.kept[c] = take;
        }
      }
    }
  }
  std::array<T, kTopBlock> threshold{};
  std::array<int64_t, kTopBlock> equal_left{}, nan_left{}, slot{};
  for (int64_t c = 0; c < width; ++c) {
    T* cand = st.candidates.data() + c * 2 * take;
    if (st.kept[c] >= take) {  // at least take numbers: the take-th largest of the candidates
      std::nth_element(cand, cand + take - 1, cand + st.kept[c], std::greater<T>());
      threshold[c] = cand[take - 1];
      int64_t above = 0;
      for (int64_t e = 0; e < take; ++e) above += cand[e] > threshold[c];
      equal_left[c] = take - above;
    } else {  // every number is taken, then NaNs
      threshold[c] = -std::numeric_limits<T>::infinity();
      equal_left[c] = st.kept[c];
      nan_left[c] = take - st.kept[c];
    }
  }
  for (int32_t i : real) {
    const T* row = rows + i * C;
    uint32_t look = 0;
    for (int64_t c = 0; c < width; ++c) look |= static_cast<uint32_t>(!(row[c] < threshold[c])) << c;
    for (; look != 0; look &= look - 1) {
      const int c = std::countr_zero(look);
      const T x = row[c];
      int32_t* out = members + c * kappa;
      if (x != x) {
        if (nan_left[c] > 0) out[slot[c]++] = i, --nan_left[c];
      } else if (x > threshold[c]) {
        out[slot[c]++] = i;
      } else if (x == threshold[c] && equal_left[c] > 0) {
        out[slot[c]++] = i, --equal_left[c];
      }
    }
  }
}

template <class T>
void cluster_topk_group(const T* a, int64_t C, const std::vector<int32_t>& real, int64_t kappa, int32_t* members) {
  TopColumns<T> state;
  const int64_t take = std::min<int64_t>(kappa, static_cast<int64_t>(real.size()));
  for (int64_t c0 = 0; c0 < C; c0 += kTopBlock)
    select_top_block(a + c0, C, std::min(kTopBlock, C - c0), real, take, kappa, state, members + c0 * kappa);
}
template void cluster_topk_group<float>(const float*, int64_t, const std::vector<int32_t>&, int64_t, int32_t*);
template void cluster_topk_group<double>(const double*, int64_t, const std::vector<int32_t>&, int64_t, int32_t*);

Tensor cluster_topk(const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  autograd::StepScope named("cluster_topk");
  CAST_CHECK(kappa >= 1, "cluster_topk: cluster size must be >= 1, got {}", kappa);
#ifdef CAST_WITH_CUDA
  if (affinity.is_cuda()) {  // selected on the device: nothing crosses to the host
    check_device_inputs("cluster_topk", affinity, mask);
    Tensor out = Tensor::empty({affinity.dim(0), affinity.dim(2), kappa}, DType::i32, Device::cuda);
    cuda::cluster_topk(out, affinity, mask, kappa);
    return out;
  }
#endif
  HostGroups h = host_groups("cluster_topk", affinity, mask, /*values_too=*/false);
  const int64_t C = h.width, n = h.n;
  std::vector<int32_t> out(h.groups * C * kappa, -1);
  // One task per group and block of clusters (select_top_block).
  const int64_t blocks = (C + kTopBlock - 1) / kTopBlock;
  std::vector<std::vector<int32_t>> real(h.groups);  // each group's real tokens, in position order
  for (int64_t g = 0; g < h.groups; ++g)
    for (int64_t i = 0; i < n; ++i)
      if (h.real(g, i)) real[g].push_back(static_cast<int32_t>(i));
  CAST_DISPATCH_FLOAT(affinity.dtype(), "cluster_topk", [&] {
    const T* values = affinity.data<T>();
    CAST_OMP("omp parallel if (h.groups * C * n > 65536)")
    {
      TopColumns<T> state;
      CAST_OMP("omp for schedule(dynamic)")
      for (int64_t task = 0; task < h.groups * blocks; ++task) {
        const int64_t g = task / blocks, c0 = task % blocks * kTopBlock, width = std::min(kTopBlock, C - c0);
        const int64_t take = std::min<int64_t>(kappa, real[g].size());
        select_top_block(values + g * n * C + c0, C, width, real[g], take, kappa, state,
                         out.data() + (g * C + c0) * kappa);
      }
    }
  });
  return to_device_i32(out, {h.groups, C, kappa}, affinity.device());
}

Tensor cluster_satopk(const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  autograd::StepScope named("cluster_satopk");
  CAST_CHECK(kappa >= 1, "cluster_satopk: cluster size must be >= 1, got {}", kappa);
#ifdef CAST_WITH_CUDA
  if (affinity.is_cuda()) {
    check_device_inputs("cluster_satopk", affinity, mask);
    Tensor out = Tensor::empty({affinity.dim(0), affinity.dim(2), kappa}, DType::i32, Device::cuda);
    cuda::cluster_satopk(out, affinity, mask, kappa);
    return out;
  }
#endif
  HostGroups h = host_groups("cluster_satopk", affinity, mask);
  const int64_t C = h.width;
  std::vector<int32_t> out(h.groups * C * kappa, -1);
  // groups are independent: one per thread
#pragma omp parallel for schedule(dynamic) if (h.groups * h.n * C > 65536)
  for (int64_t g = 0; g < h.groups; ++g) {
    auto a = [&](int64_t i, int64_t c) { return h.values[(g * h.n + i) * C + c]; };
    // a token's clusters in the order of top-k (math/topk_order.h): larger first, NaN last, ties
    // toward the lower cluster
    auto first_cluster = [&](int64_t i, auto&& allowed) {
      int64_t best = -1;
      for (int64_t c = 0; c < C; ++c)
        if (allowed(c) && (best < 0 || ranks_before(a(i, c), c, a(i, best), best))) best = c;
      return best;
    };
    std::vector<int32_t> tokens;
    std::vector<double> best(h.n, 0.0);
    for (int64_t i = 0; i < h.n; ++i) {
      if (!h.real(g, i)) continue;
      tokens.push_back(static_cast<int32_t>(i));
      best[i] = a(i, first_cluster(i, [](int64_t) { return true; }));
    }
    // visiting order: best affinity in the same order, ties toward the lower position
    std::sort(tokens.begin(), tokens.end(), [&](int32_t x, int32_t y) { return ranks_before(best[x], x, best[y], y); });
    std::vector<int64_t> filled(C, 0);
    std::vector<int32_t> cluster_of(h.n, -1);
    for (int32_t i : tokens) {  // with every cluster full the token stays out (only when C·κ < real tokens)
      const int64_t c = first_cluster(i, [&](int64_t c2) { return filled[c2] < kappa; });
      if (c < 0) continue;
      ++filled[c];
      cluster_of[i] = static_cast<int32_t>(c);
    }
    std::vector<int64_t> slot(C, 0);
    for (int64_t i = 0; i < h.n; ++i)  // members in position order
      if (cluster_of[i] >= 0) out[(g * C + cluster_of[i]) * kappa + slot[cluster_of[i]]++] = static_cast<int32_t>(i);
  }
  return to_device_i32(out, {h.groups, C, kappa}, affinity.device());
}

Tensor lsh_hash(const Tensor& q, const Tensor& planes) {
  autograd::StepScope named("lsh_hash");
  check_ndim("lsh_hash", q, 3, "q");
  check_ndim("lsh_hash", planes, 2, "planes");
  const int64_t bits = planes.dim(0);
  CAST_CHECK(bits >= 1 && bits <= 63, "lsh_hash: 1..63 hash bits are supported, got {}", bits);
  CAST_CHECK(planes.dim(1) == q.dim(2) + 1, "lsh_hash: planes {} must be [bits, {}]", planes.describe(), q.dim(2) + 1);
#ifdef CAST_WITH_CUDA
  if (q.is_cuda()) {  // the planes go over (a few hundred bytes); the queries stay
    check_device_inputs("lsh_hash", q, Tensor());
    check_dtype("lsh_hash", planes, DType::f32, "planes");
    Tensor out = Tensor::empty({q.dim(0), q.dim(1)}, DType::i64, Device::cuda);
    cuda::lsh_hash(out, q, planes.to(Device::cuda));
    return out;
  }
#endif
  HostGroups h = host_groups("lsh_hash", q, Tensor());
  const int64_t d = h.width;
  std::vector<double> a = planes.to_double_vector();
  std::vector<int64_t> out(h.groups * h.n, 0);
#pragma omp parallel for if (h.groups * h.n * bits * d > 65536)
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

namespace {

// One group's Hamming k-means on the host: code (N) hashes, real the group's real tokens in
// position order, assign (N) filled with −1 beforehand.
void kmeans_group(const int64_t* code, const std::vector<int64_t>& real, int64_t clusters, int64_t iterations,
                  uint64_t seed, int64_t g, int32_t* assign) {
  const int64_t R = static_cast<int64_t>(real.size());
  int64_t draw = 0;  // position in this group's stream (math/clustering_rules.h)
  // C distinct random real queries (C < R): the first C swaps of a Fisher–Yates shuffle;
  // with C >= R every query, then again in the same order
  std::vector<int64_t> perm = real;
  for (int64_t c = 0; c < std::min(clusters, R - 1); ++c)
    std::swap(perm[c], perm[c + draw_below(kmeans_draw(seed, g, draw++), R - c)]);
  std::vector<int64_t> centroid(clusters);
  for (int64_t c = 0; c < clusters; ++c) centroid[c] = code[perm[c % R]];
  auto assign_all = [&] {
    for (int64_t i : real) {
      int best = 65, arg = 0;
      for (int64_t c = 0; c < clusters; ++c) {
        const int dist = std::popcount(static_cast<uint64_t>(code[i] ^ centroid[c]));
        if (dist < best) best = dist, arg = static_cast<int>(c);
      }
      assign[i] = arg;
    }
  };
  assign_all();
  for (int64_t it = 0; it < iterations; ++it) {
    std::vector<int64_t> members(clusters, 0);
    std::vector<std::array<int64_t, 64>> ones(clusters);
    for (auto& o : ones) o.fill(0);
    for (int64_t i : real) {
      ++members[assign[i]];
      for (int b = 0; b < 64; ++b) ones[assign[i]][b] += (code[i] >> b) & 1;
    }
    for (int64_t c = 0; c < clusters; ++c) {
      if (members[c] == 0) {  // an empty cluster restarts from a random real query
        centroid[c] = code[real[draw_below(kmeans_draw(seed, g, draw++), R)]];
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

}  // namespace

Tensor hamming_kmeans(const Tensor& hashes, const Tensor& mask, int64_t clusters, int64_t iterations, uint64_t seed) {
  autograd::StepScope named("hamming_kmeans");
  check_dtype("hamming_kmeans", hashes, DType::i64, "hashes");
  check_ndim("hamming_kmeans", hashes, 2, "hashes");
  CAST_CHECK(clusters >= 1, "hamming_kmeans: clusters must be >= 1, got {}", clusters);
  const int64_t G = hashes.dim(0), N = hashes.dim(1);
  if (mask.defined()) check_mask_fits("hamming_kmeans", mask, hashes);
#ifdef CAST_WITH_CUDA
  if (hashes.is_cuda()) {
    Tensor assign = Tensor::empty({G, N}, DType::i32, Device::cuda);
    cuda::hamming_kmeans(assign, hashes, mask, clusters, iterations, seed);
    return assign;
  }
#endif
  const Tensor host = hashes.to(Device::cpu);
  const int64_t* code = host.data<int64_t>();
  std::vector<double> m = mask.defined() ? mask.to_double_vector() : std::vector<double>();
  const int64_t per_row = mask.defined() ? G / mask.dim(0) : 1;
  std::vector<int32_t> assign(G * N, -1);
  // groups are independent (each draws from its own stream): one per thread
#pragma omp parallel for schedule(dynamic) if (G * N > 4096)
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int64_t> real;
    for (int64_t i = 0; i < N; ++i)
      if (m.empty() || m[(g / per_row) * N + i] != 0.0) real.push_back(i);
    if (!real.empty()) kmeans_group(code + g * N, real, clusters, iterations, seed, g, assign.data() + g * N);
  }
  return to_device_i32(assign, {G, N}, hashes.device());
}

Tensor cluster_counts(const Tensor& assignment, int64_t clusters, DType dtype) {
  check_dtype("cluster_counts", assignment, DType::i32, "assignment");
  check_ndim("cluster_counts", assignment, 2, "assignment");
  const int64_t G = assignment.dim(0), N = assignment.dim(1);
#ifdef CAST_WITH_CUDA
  if (assignment.is_cuda() && dtype == DType::f32) {  // counted on the device; range checked there too
    check_index_range("cluster_counts", assignment, -1, clusters);
    Tensor counts = Tensor::empty({G, clusters}, DType::f32, Device::cuda);
    cuda::cluster_counts(counts, assignment, clusters, /*inverse=*/false);
    return counts;
  }
#endif
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

Tensor repeat_for_heads(const Tensor& ids, int64_t heads) {
  check_dtype("repeat_for_heads", ids, DType::i32, "ids");
  CAST_CHECK(ids.ndim() >= 1 && heads >= 1, "repeat_for_heads: ids {} and {} heads", ids.describe(), heads);
  Shape shape = ids.shape();
  shape.insert(shape.begin() + 1, heads);
  const int64_t B = ids.dim(0), width = B > 0 ? ids.numel() / B : 0;
#ifdef CAST_WITH_CUDA
  if (ids.is_cuda()) {
    Tensor out = Tensor::empty(shape, DType::i32, Device::cuda);
    cuda::repeat_heads(out, ids, heads);
    return out;
  }
#endif
  Tensor out = Tensor::empty(shape, DType::i32, Device::cpu);
  const int32_t* in = ids.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h) std::copy(in + b * width, in + (b + 1) * width, o + (b * heads + h) * width);
  return out;
}

}  // namespace cast::ops
