// CAST Top-K clustering on the device: one thread block per (group, cluster) selects the κ real
// tokens of largest affinity, in the order of ops/topk_order.h (larger first, NaN last, ties
// toward the lower position), and writes them in ascending position order. No sort: a radix
// select finds the κ-th key in four passes over the column (8 bits each, a 256-bin histogram in
// shared memory), then one ordered pass takes every token above it and the first tokens (by
// position) equal to it, placing each by a block-wide prefix sum. O(N) work per cluster.
#include "cuda/clustering.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace cast::cuda {

namespace {

// A key whose unsigned order is the ranking order: larger floats larger keys, every NaN the
// smallest key (0), and -0 the same key as +0 (they compare equal).
__device__ uint32_t rank_key(float v) {
  if (v != v) return 0u;
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of `flag` over the block (blockDim.x <= 1024, a multiple of 32); every
// thread also receives the block's total.
__device__ int block_exclusive_scan(int flag, int& total) {
  CAST_SHARED_ARRAY(int, buf, 1024);
  const int t = threadIdx.x;
  __syncthreads();  // buf may still be read from a previous call
  buf[t] = flag;
  __syncthreads();
  for (int offset = 1; offset < static_cast<int>(blockDim.x); offset <<= 1) {
    const int add = t >= offset ? buf[t - offset] : 0;
    __syncthreads();
    buf[t] = buf[t] + add;
    __syncthreads();
  }
  total = buf[blockDim.x - 1];
  return buf[t] - flag;
}

__global__ void cluster_topk_kernel(int32_t* out, const float* aff, const float* mask, int64_t N, int64_t C,
                                    int64_t per_mask_row, int64_t kappa) {
  const int64_t g = blockIdx.x / C, c = blockIdx.x % C;
  const float* column = aff + g * N * C + c;  // token i at column[i * C]
  const float* real = mask ? mask + (g / per_mask_row) * N : nullptr;
  int32_t* members = out + blockIdx.x * kappa;
  CAST_SHARED_ARRAY(int, histogram, 256);
  CAST_SHARED_ARRAY(uint32_t, found, 2);  // the key prefix found so far, and how many still to take

  // how many real tokens: the clusters take min(κ, that)
  int local = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) local += (!real || real[i] != 0.f) ? 1 : 0;
  int eligible = 0;
  block_exclusive_scan(local, eligible);
  const int64_t take = eligible < kappa ? eligible : kappa;
  for (int64_t s = take + threadIdx.x; s < kappa; s += blockDim.x) members[s] = -1;
  if (take == 0) return;

  // radix select: the key of the take-th largest, and how many tokens with exactly that key
  // are taken (the lowest positions among them)
  if (threadIdx.x == 0) {
    found[0] = 0u;
    found[1] = static_cast<uint32_t>(take);
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    const uint32_t prefix = found[0], high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      if (real && real[i] == 0.f) continue;
      const uint32_t key = rank_key(column[i * C]);
      if ((key & high_mask) == (prefix & high_mask)) histogram.atomic_add((key >> shift) & 255u, 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // from the top bin down, until the bin holding the remaining rank
      uint32_t remaining = found[1];
      int bin = 255;
      for (; bin > 0; --bin) {
        const uint32_t count = static_cast<uint32_t>(histogram[bin]);
        if (count >= remaining) break;
        remaining -= count;
      }
      found[0] = prefix | (static_cast<uint32_t>(bin) << shift);
      found[1] = remaining;
    }
    __syncthreads();
  }
  const uint32_t threshold = found[0];
  const int equal_to_take = static_cast<int>(found[1]);

  // one pass in position order: rank among the equal keys, then the slot among the chosen
  int equal_before = 0, chosen_before = 0;
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    uint32_t key = 0;
    bool ok = false;
    if (i < N && (!real || real[i] != 0.f)) {
      key = rank_key(column[i * C]);
      ok = true;
    }
    int equal_total = 0, chosen_total = 0;
    const int equal_rank = equal_before + block_exclusive_scan(ok && key == threshold ? 1 : 0, equal_total);
    const bool chosen = ok && (key > threshold || (key == threshold && equal_rank < equal_to_take));
    const int slot = chosen_before + block_exclusive_scan(chosen ? 1 : 0, chosen_total);
    if (chosen) members[slot] = static_cast<int32_t>(i);
    equal_before += equal_total;
    chosen_before += chosen_total;
  }
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

}  // namespace cast::cuda
