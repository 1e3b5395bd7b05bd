// The clustering steps on the device, each equal to its CPU op (ops/attention/clustering.cpp) bit for bit.
// CAST Top-K: one thread block per (group, cluster) selects the κ real tokens of largest
// affinity with a radix select (cuda/select.cuh), O(N) per cluster, in ascending position order.
#include "cuda/attention/clustering.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/select.cuh"
#include "math/clustering_rules.h"
#include "math/topk_order.h"

namespace cast::cuda {

namespace {

__global__ void cluster_topk_kernel(int32_t* out, const float* aff, const float* mask, int64_t N, int64_t C,
                                    int64_t per_mask_row, int64_t kappa) {
  const int64_t g = blockIdx.x / C, c = blockIdx.x % C;
  const float* real = mask ? mask + (g / per_mask_row) * N : nullptr;
  int32_t* members = out + blockIdx.x * kappa;
  int eligible = 0;  // the clusters take min(κ, real tokens)
  block_exclusive_scan(count_eligible(real, N), eligible);
  const int64_t take = eligible < kappa ? eligible : kappa;
  for (int64_t s = take + threadIdx.x; s < kappa; s += blockDim.x) members[s] = -1;
  block_select_top(members, aff + g * N * C + c, C, real, N, take);  // token i at [i * C]
}

// ---------------------------------------------------------------- Single-Assignment Top-K
// One block per group. The visiting order is a bitonic sort of 64-bit keys (rank key of the
// token's best affinity above, the complement of its position below: larger first, ties toward
// the lower position; padding key 0 sorts last). Then warp 0 places the tokens one after another:
// each lane owns clusters lane, lane + 32, ... and their fill counts, and a warp argmax in the
// order of top-k picks the best cluster with room. Finally each cluster lists its members in
// position order.
__global__ void cluster_satopk_kernel(int32_t* out, const float* aff, const float* mask, int64_t N, int64_t C,
                                      int64_t per_mask_row, int64_t kappa, int64_t padded, uint64_t* keys_all,
                                      int32_t* cluster_of_all, int32_t* filled_all) {
  const int64_t g = blockIdx.x;
  const float* a = aff + g * N * C;  // a[i * C + c]
  const float* real = mask ? mask + (g / per_mask_row) * N : nullptr;
  uint64_t* keys = keys_all + g * padded;
  int32_t* cluster_of = cluster_of_all + g * N;
  int32_t* filled = filled_all + g * C;
  for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
    uint64_t key = 0;
    if (i < N && (!real || real[i] != 0.f)) {
      int64_t best = 0;
      for (int64_t c = 1; c < C; ++c)
        if (ranks_before(a[i * C + c], c, a[i * C + best], best)) best = c;
      key = (static_cast<uint64_t>(rank_key(a[i * C + best])) << 32) | (0xFFFFFFFFull - static_cast<uint64_t>(i));
    }
    keys[i] = key;
    if (i < N) cluster_of[i] = -1;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) filled[c] = 0;
  __syncthreads();
  for (int64_t k = 2; k <= padded; k <<= 1)  // bitonic sort, descending
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < padded; i += blockDim.x) {
        const int64_t l = i ^ j;
        if (l <= i) continue;
        const uint64_t x = keys[i], y = keys[l];
        if ((i & k) == 0 ? x < y : x > y) {
          keys[i] = y;
          keys[l] = x;
        }
      }
      __syncthreads();
    }
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    for (int64_t t = 0; t < padded && keys[t] != 0; ++t) {
      const int64_t i = static_cast<int64_t>(0xFFFFFFFFull - (keys[t] & 0xFFFFFFFFull));
      float value = 0.f;
      int64_t best = -1;
      for (int64_t c = lane; c < C; c += 32)
        if (filled[c] < kappa && (best < 0 || ranks_before(a[i * C + c], c, value, best))) {
          best = c;
          value = a[i * C + c];
        }
      for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_value = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
        const int64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, offset);
        if (other >= 0 && (best < 0 || ranks_before(other_value, other, value, best))) {
          best = other;
          value = other_value;
        }
      }
      if (best >= 0 && best % 32 == lane) {  // the owner of the cluster keeps its count
        ++filled[best];
        cluster_of[i] = static_cast<int32_t>(best);
      }
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    int32_t* members = out + (g * C + c) * kappa;
    int64_t slot = 0;
    for (int64_t i = 0; i < N && slot < kappa; ++i)
      if (cluster_of[i] == c) members[slot++] = static_cast<int32_t>(i);
    for (; slot < kappa; ++slot) members[slot] = -1;
  }
}

// ---------------------------------------------------------------- LSH
// The planes in double, once per call: (bits, d + 1) floats to as many doubles.
__global__ void planes_to_double_kernel(double* out, const float* planes, int64_t n) {
  CAST_KERNEL_LOOP(i, n) out[i] = static_cast<double>(planes[i]);
}

// 64 threads per query, one per plane: thread b takes the sign of q·a_b + a_b0, summed in double
// in the CPU op's order. A product of two floats is exact in double, so the sums equal the host's
// bit for bit, with or without fused multiply-adds. Each warp's 32 signs are one ballot, written
// as its half of the 64-bit code (bit 63 and the bits past `bits` stay 0). A block holds
// kLshQueries queries; their rows are converted to double once, into shared memory, and the
// planes arrive in double: converted in the loop, two float-to-double conversions per product
// (a quarter-rate instruction on an H100) made this kernel 2.5 ms of a clustered Text step's layer.
constexpr int kLshQueries = kThreads / 64;
__global__ void lsh_hash_kernel(uint32_t* out_halves, const float* q, const double* planes, int64_t rows, int64_t d,
                                int64_t bits) {
  CAST_DYNAMIC_SHARED(double, xs, kLshQueries * d);
  const int local = static_cast<int>(threadIdx.x / 64), b = static_cast<int>(threadIdx.x % 64);
  for (int64_t r0 = blockIdx.x * int64_t{kLshQueries}; r0 < rows; r0 += int64_t{gridDim.x} * kLshQueries) {
    const int64_t r = r0 + local;  // the same in both warps of a query
    __syncthreads();  // the previous queries' rows are read no more
    if (r < rows)
      for (int64_t j = b; j < d; j += 64) xs[local * d + j] = static_cast<double>(q[r * d + j]);
    __syncthreads();
    if (r >= rows) continue;
    bool positive = false;
    if (b < bits) {
      const double* a = planes + b * (d + 1);
      double s = a[d];
      for (int64_t j = 0; j < d; ++j) s += xs[local * d + j] * a[j];
      positive = s > 0;
    }
    const unsigned signs = __ballot_sync(0xffffffffu, positive);
    if (b % 32 == 0) out_halves[2 * r + b / 32] = signs;  // little-endian: bits 0–31, then 32–63
  }
}

// ---------------------------------------------------------------- Hamming k-means
__device__ int hamming(int64_t a, int64_t b) { return __popcll(static_cast<unsigned long long>(a ^ b)); }

// Hamming k-means in the CPU op's steps, over several blocks per group so that a batch of one
// fills the GPU (one block per group filled 4 of an H100's 132 SMs at batch 1): the assignment
// and the counting split a group's tokens into chunks of kKmeansChunk, a block each; the setup
// (the real positions in order, the first C swaps of a Fisher–Yates shuffle from the group's own
// Philox stream) and each iteration's majority votes and restarts of empty clusters, which walk
// the clusters in order, stay one block per group. Counts are integer atomics (any order gives
// the same sums), so the clusters are the CPU's whatever the split.
constexpr int64_t kKmeansChunk = 1024;

struct Kmeans {  // a launch's groups and their scratch, each (G, ·)
  int32_t* assign;        // (G, N)
  const int64_t* code;    // (G, N)
  const float* mask;      // (G / per_mask_row, N) or null
  int32_t *real, *perm;   // (G, N): the real positions in order; the shuffle
  int64_t* centroid;      // (G, C)
  int32_t *members, *ones;  // (G, C), (G, C, 64): this iteration's counts
  int64_t *count, *draws;   // (G): real tokens; the position in the group's stream
  int64_t N, per_mask_row, C, chunks;
  uint64_t seed;
};

__global__ void kmeans_setup_kernel(Kmeans k) {
  const int64_t g = blockIdx.x, N = k.N, C = k.C;
  const float* m = k.mask ? k.mask + (g / k.per_mask_row) * N : nullptr;
  const int64_t* code = k.code + g * N;
  int32_t *assign = k.assign + g * N, *real = k.real + g * N, *perm = k.perm + g * N;
  for (int64_t e = threadIdx.x; e < C * 64; e += blockDim.x) k.ones[g * C * 64 + e] = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) k.members[g * C + c] = 0;
  int64_t count = 0;
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool ok = i < N && (!m || m[i] != 0.f);
    if (i < N) assign[i] = -1;
    int total = 0;
    const int64_t pos = count + block_exclusive_scan(ok ? 1 : 0, total);
    if (ok) {
      real[pos] = static_cast<int32_t>(i);
      perm[pos] = static_cast<int32_t>(i);
    }
    count += total;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  k.count[g] = count;
  int64_t draw = 0;
  if (count > 0) {
    for (int64_t c = 0; c < (C < count - 1 ? C : count - 1); ++c) {
      const int64_t j = c + draw_below(kmeans_draw(k.seed, g, draw++), count - c);
      const int32_t x = perm[c];
      perm[c] = perm[j];
      perm[j] = x;
    }
    for (int64_t c = 0; c < C; ++c) k.centroid[g * C + c] = code[perm[c % count]];
  }
  k.draws[g] = draw;
}

// Every real query of a chunk to its nearest centroid (ties toward the lower cluster).
__global__ void kmeans_assign_kernel(Kmeans k) {
  const int64_t g = blockIdx.x / k.chunks, first = (blockIdx.x % k.chunks) * kKmeansChunk;
  const int64_t end = k.count[g] < first + kKmeansChunk ? k.count[g] : first + kKmeansChunk;
  const int64_t *code = k.code + g * k.N, *centroid = k.centroid + g * k.C;
  for (int64_t t = first + threadIdx.x; t < end; t += blockDim.x) {
    const int64_t i = k.real[g * k.N + t];
    int best = 65;
    int32_t arg = 0;
    for (int64_t c = 0; c < k.C; ++c) {
      const int dist = hamming(code[i], centroid[c]);
      if (dist < best) best = dist, arg = static_cast<int32_t>(c);
    }
    k.assign[g * k.N + i] = arg;
  }
}

// A chunk's members and set bits per cluster, counted in shared memory first (C·65 counters)
// and added to the group's counts once per block: each token's up to 64 increments went to
// global memory, where the tokens of one cluster queue on the same counters (0.23 ms a launch
// at the Text preset on an H100). Integer sums: the same counts in any order.
__global__ void kmeans_count_shared_kernel(Kmeans k) {
  const int64_t g = blockIdx.x / k.chunks, first = (blockIdx.x % k.chunks) * kKmeansChunk, C = k.C;
  const int64_t end = k.count[g] < first + kKmeansChunk ? k.count[g] : first + kKmeansChunk;
  CAST_DYNAMIC_SHARED(int32_t, counts, C * 65);  // ones (C, 64), then members (C)
  for (int64_t e = threadIdx.x; e < C * 65; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t t = first + threadIdx.x; t < end; t += blockDim.x) {
    const int64_t i = k.real[g * k.N + t], c = k.assign[g * k.N + i], code = k.code[g * k.N + i];
    counts.atomic_add(C * 64 + c, 1);
    for (int b = 0; b < 64; ++b)
      if ((code >> b) & 1) counts.atomic_add(c * 64 + b, 1);
  }
  __syncthreads();
  int32_t *members = k.members + g * C, *ones = k.ones + g * C * 64;
  for (int64_t e = threadIdx.x; e < C * 65; e += blockDim.x) {
    const int32_t n = counts[e];
    if (n != 0) atomicAdd(e < C * 64 ? ones + e : members + (e - C * 64), n);
  }
}

// The same straight into global memory, where C·65 counters outgrow a block's shared memory.
__global__ void kmeans_count_kernel(Kmeans k) {
  const int64_t g = blockIdx.x / k.chunks, first = (blockIdx.x % k.chunks) * kKmeansChunk;
  const int64_t end = k.count[g] < first + kKmeansChunk ? k.count[g] : first + kKmeansChunk;
  int32_t *members = k.members + g * k.C, *ones = k.ones + g * k.C * 64;
  for (int64_t t = first + threadIdx.x; t < end; t += blockDim.x) {
    const int64_t i = k.real[g * k.N + t], c = k.assign[g * k.N + i], code = k.code[g * k.N + i];
    atomicAdd(members + c, 1);
    for (int b = 0; b < 64; ++b)
      if ((code >> b) & 1) atomicAdd(ones + c * 64 + b, 1);
  }
}

// The majority votes in parallel, then the empty clusters restarted by thread 0 in cluster order;
// the counts are cleared for the next iteration.
__global__ void kmeans_vote_kernel(Kmeans k) {
  const int64_t g = blockIdx.x, C = k.C, count = k.count[g];
  if (count == 0) return;
  int32_t *members = k.members + g * C, *ones = k.ones + g * C * 64;
  int64_t* centroid = k.centroid + g * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    if (members[c] == 0) continue;
    int64_t next = 0;  // majority vote; an exact tie sets the bit to 0
    for (int b = 0; b < 64; ++b)
      if (2 * ones[c * 64 + b] > members[c]) next |= int64_t{1} << b;
    centroid[c] = next;
  }
  if (threadIdx.x == 0) {
    int64_t draw = k.draws[g];
    for (int64_t c = 0; c < C; ++c)
      if (members[c] == 0)
        centroid[c] = k.code[g * k.N + k.real[g * k.N + draw_below(kmeans_draw(k.seed, g, draw++), count)]];
    k.draws[g] = draw;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < C * 64; e += blockDim.x) ones[e] = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) members[c] = 0;
}

__global__ void slot_mask_kernel(float* mask, const int32_t* members, int64_t n) {
  CAST_KERNEL_LOOP(i, n) mask[i] = members[i] >= 0 ? 1.f : 0.f;
}

}  // namespace

void slot_mask(Tensor& mask, const Tensor& members) {
  const int64_t n = members.numel();
  if (n == 0) return;
  CAST_LAUNCH(slot_mask_kernel, blocks_for(n), kThreads, 0, fptr(mask), members.data<int32_t>(), n);
  CUDA_CHECK_LAUNCH();
}

void cluster_topk(Tensor& out, const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  const int64_t G = affinity.dim(0), N = affinity.dim(1), C = affinity.dim(2);
  if (G * C == 0) return;
  const int64_t per_mask_row = mask.defined() ? G / mask.dim(0) : 1;
  CAST_CHECK(G * C <= int64_t{INT32_MAX}, "cluster_topk: {} clusters in all is more than one launch takes", G * C);
  CAST_LAUNCH(cluster_topk_kernel, static_cast<unsigned>(G * C), kThreads, 0, out.data<int32_t>(), fptr(affinity),
              mask.defined() ? fptr(mask) : nullptr, N, C, per_mask_row, kappa);
  CUDA_CHECK_LAUNCH();
}

void cluster_satopk(Tensor& out, const Tensor& affinity, const Tensor& mask, int64_t kappa) {
  const int64_t G = affinity.dim(0), N = affinity.dim(1), C = affinity.dim(2);
  if (G * C == 0) return;
  CAST_CHECK(N < int64_t{0xFFFFFFFF} && G <= int64_t{INT32_MAX},
             "cluster_satopk: {} tokens in {} groups is more than one launch takes", N, G);
  int64_t padded = 1;
  while (padded < N) padded <<= 1;
  Tensor keys = Tensor::empty({G, padded}, DType::i64, Device::cuda);
  Tensor cluster_of = Tensor::empty({G, N}, DType::i32, Device::cuda);
  Tensor filled = Tensor::empty({G, C}, DType::i32, Device::cuda);
  const int64_t per_mask_row = mask.defined() ? G / mask.dim(0) : 1;
  CAST_LAUNCH(cluster_satopk_kernel, static_cast<unsigned>(G), kThreads, 0, out.data<int32_t>(), fptr(affinity),
              mask.defined() ? fptr(mask) : nullptr, N, C, per_mask_row, kappa, padded,
              reinterpret_cast<uint64_t*>(keys.data<int64_t>()), cluster_of.data<int32_t>(), filled.data<int32_t>());
  CUDA_CHECK_LAUNCH();
}

void lsh_hash(Tensor& out, const Tensor& q, const Tensor& planes) {
  const int64_t rows = q.dim(0) * q.dim(1), d = q.dim(2), bits = planes.dim(0);
  if (rows == 0) return;
  const size_t shared = kLshQueries * static_cast<size_t>(d) * sizeof(double);
  CAST_CHECK(shared <= 48 * 1024, "lsh_hash: head width {} is more than the kernel's shared memory holds (1536)", d);
  Tensor planes64 = Tensor::empty({planes.numel()}, DType::i64, Device::cuda);  // doubles, 8 bytes each
  auto* a = reinterpret_cast<double*>(planes64.data<int64_t>());
  CAST_LAUNCH(planes_to_double_kernel, blocks_for(planes.numel()), kThreads, 0, a, fptr(planes), planes.numel());
  CAST_LAUNCH(lsh_hash_kernel, blocks_for(rows * 64), kThreads, shared,
              reinterpret_cast<uint32_t*>(out.data<int64_t>()), fptr(q), a, rows, d, bits);
  CUDA_CHECK_LAUNCH();
}

void hamming_kmeans(Tensor& assign, const Tensor& hashes, const Tensor& mask, int64_t clusters, int64_t iterations,
                    uint64_t seed) {
  const int64_t G = hashes.dim(0), N = hashes.dim(1);
  if (G * N == 0) return;
  const int64_t chunks = (N + kKmeansChunk - 1) / kKmeansChunk;
  CAST_CHECK(G * chunks <= int64_t{INT32_MAX} && N <= int64_t{INT32_MAX},
             "hamming_kmeans: {} groups of {} is more than one launch takes", G, N);
  Tensor real = Tensor::empty({G, N}, DType::i32, Device::cuda), perm = Tensor::empty({G, N}, DType::i32, Device::cuda);
  Tensor centroid = Tensor::empty({G, clusters}, DType::i64, Device::cuda);
  Tensor members = Tensor::empty({G, clusters}, DType::i32, Device::cuda);
  Tensor ones = Tensor::empty({G, clusters, 64}, DType::i32, Device::cuda);
  Tensor counts = Tensor::empty({G, 2}, DType::i64, Device::cuda);  // real tokens, draws taken
  Kmeans k{assign.data<int32_t>(),
           hashes.data<int64_t>(),
           mask.defined() ? fptr(mask) : nullptr,
           real.data<int32_t>(),
           perm.data<int32_t>(),
           centroid.data<int64_t>(),
           members.data<int32_t>(),
           ones.data<int32_t>(),
           counts.data<int64_t>(),
           counts.data<int64_t>() + G,
           N,
           mask.defined() ? G / mask.dim(0) : 1,
           clusters,
           chunks,
           seed};
  const auto groups = static_cast<unsigned>(G), chunked = static_cast<unsigned>(G * chunks);
  CAST_LAUNCH(kmeans_setup_kernel, groups, kThreads, 0, k);
  CAST_LAUNCH(kmeans_assign_kernel, chunked, kThreads, 0, k);
  const size_t count_bytes = static_cast<size_t>(clusters) * 65 * sizeof(int32_t);
  for (int64_t it = 0; it < iterations; ++it) {
    if (count_bytes <= 48 * 1024) CAST_LAUNCH(kmeans_count_shared_kernel, chunked, kThreads, count_bytes, k);
    else CAST_LAUNCH(kmeans_count_kernel, chunked, kThreads, 0, k);
    CAST_LAUNCH(kmeans_vote_kernel, groups, kThreads, 0, k);
    CAST_LAUNCH(kmeans_assign_kernel, chunked, kThreads, 0, k);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
