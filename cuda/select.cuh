#pragma once
// Selecting the k largest entries of a row inside one thread block, in the order of top-k
// (math/topk_order.h: larger first, NaN last, ties toward the lower position), with no sort: a
// radix select finds the k-th key in four passes over the row (8 bits each, a 256-bin histogram
// in shared memory), then one ordered pass takes every entry above it and the first entries (by
// position) equal to it, placing each by a block-wide prefix sum. O(n) work per row.
// Used by CAST Top-K (cuda/attention/clustering.cu) and top-k (cuda/topk.cu).
#include "cuda/common.cuh"

namespace cast::cuda {

// A key whose unsigned order is the ranking order: larger floats larger keys, every NaN the
// smallest key (0), and -0 the same key as +0 (they compare equal).
__device__ inline uint32_t rank_key(float v) {
  if (v != v) return 0u;
  if (v == 0.f) v = 0.f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of `flag` over the block (blockDim.x <= 1024, a multiple of 32); every
// thread also receives the block's total.
__device__ inline int block_exclusive_scan(int flag, int& total) {
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

// 1 for each of this thread's entries (threadIdx.x, + blockDim.x, ...) that is eligible.
__device__ inline int count_eligible(const float* real, int64_t n) {
  int local = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) local += (!real || real[i] != 0.f) ? 1 : 0;
  return local;
}

// Writes to out[0, take) the positions of the `take` eligible entries (real == nullptr or
// real[i] != 0) of largest rank among values[i * stride], i < n, in ascending position order.
// take must not exceed the eligible count. Every thread of the block calls it.
__device__ inline void block_select_top(int32_t* out, const float* values, int64_t stride, const float* real, int64_t n,
                                        int64_t take) {
  if (take == 0) return;
  CAST_SHARED_ARRAY(int, histogram, 256);
  CAST_SHARED_ARRAY(uint32_t, found, 2);  // the key prefix found so far, and how many still to take
  // radix select: the key of the take-th largest, and how many entries with exactly that key
  // are taken (the lowest positions among them)
  if (threadIdx.x == 0) {
    found[0] = 0u;
    found[1] = static_cast<uint32_t>(take);
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    const uint32_t prefix = found[0], high_mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (real && real[i] == 0.f) continue;
      const uint32_t key = rank_key(values[i * stride]);
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
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    uint32_t key = 0;
    bool ok = false;
    if (i < n && (!real || real[i] != 0.f)) {
      key = rank_key(values[i * stride]);
      ok = true;
    }
    int equal_total = 0, chosen_total = 0;
    const int equal_rank = equal_before + block_exclusive_scan(ok && key == threshold ? 1 : 0, equal_total);
    const bool chosen = ok && (key > threshold || (key == threshold && equal_rank < equal_to_take));
    const int slot = chosen_before + block_exclusive_scan(chosen ? 1 : 0, chosen_total);
    if (chosen) out[slot] = static_cast<int32_t>(i);
    equal_before += equal_total;
    chosen_before += chosen_total;
  }
}

}  // namespace cast::cuda
