// Improved clustered attention's top-key term, fused (cuda/attention/improved_clustered_output_topkey.h).
//
// A query attends to its cluster's top-key list only (k keys, 32 by default), so there is no
// tile of keys shared by a block of queries to stage in shared memory as flash attention does:
// each query is one warp, its row held four columns to a lane (d ≤ 128, in registers), and each
// key row is read by the warp in one coalesced pass (a cluster's k rows stay in L1/L2 across its
// members). Forward: an online softmax over the filled slots; nothing of size N·k·d is stored.
// Backward: one block per (head, cluster); its warps take the member queries (found by scanning
// the assignment), recompute the probabilities from the saved log-sum-exp, write their own dq
// rows and add their dK_T, dV_T shares into shared memory; the block then adds the cluster's k
// rows into dk and dv (atomics: one key can be in several clusters' lists).
//
// NaN as the reference softmax: a row whose sum is NaN outputs NaN and passes NaN gradients; a row
// with no key (no cluster, or only empty slots) outputs zeros with log-sum-exp −∞.
#include <cmath>

#include "math/softmax_rule.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/attention/improved_clustered_output_topkey.h"

namespace cast::cuda {

namespace {

constexpr int kBackwardThreads = 128;
constexpr int kWarpThreads = 256;                 // 8 query warps per forward block
constexpr int kColumns = kTopKeyMaxHead / 32;     // columns per lane
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // the default shared memory of a block

// Row `row` of width d into a lane's registers: columns lane, lane + 32, ... (zeros past d).
__device__ __forceinline__ void load_lane_row(float (&x)[kColumns], const float* row, int d, int lane) {
#pragma unroll
  for (int c = 0; c < kColumns; ++c) x[c] = lane + 32 * c < d ? row[lane + 32 * c] : 0.f;
}

// Σ_e a_e · row_e over the warp (every lane gets it).
__device__ __forceinline__ float warp_dot(const float (&a)[kColumns], const float* row, int d, int lane) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kColumns; ++c) s += lane + 32 * c < d ? a[c] * row[lane + 32 * c] : 0.f;
  return warp_sum(s);
}

__global__ void topkey_forward_kernel(float* top_out, float* lse, const float* q, const float* k, const float* v,
                                      const int32_t* top, const int32_t* assign, int BH, int N, int C, int K, int d,
                                      float scale) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < BH * N; row += gridDim.x * warps) {
    const int bh = row / N, j = assign[row];
    float qi[kColumns], acc[kColumns];
    load_lane_row(qi, q + row * d, d, lane);
#pragma unroll
    for (int c = 0; c < kColumns; ++c) acc[c] = 0.f;
    float m = softmax_rule::masked<float>(), l = 0.f;
    if (j >= 0 && j < C) {
      const int32_t* keys = top + (bh * C + j) * K;
      for (int t = 0; t < K; ++t) {
        const int key = keys[t];
        if (key < 0 || key >= N) continue;  // an empty slot (a bad id is reported by the op's check)
        const float score = warp_dot(qi, k + (bh * N + key) * d, d, lane) * scale;
        const float m_new = fmaxf(m, score);
        const float correction = softmax_rule::rescale(m, m_new);
        const float p = softmax_rule::weight(score, m_new);
        const float* vr = v + (bh * N + key) * d;
#pragma unroll
        for (int c = 0; c < kColumns; ++c)
          acc[c] = acc[c] * correction + (lane + 32 * c < d ? p * vr[lane + 32 * c] : 0.f);
        l = l * correction + p;
        m = m_new;
      }
    }
    const float inv = softmax_rule::inverse_sum(l);  // no key: zeros; NaN stays NaN
#pragma unroll
    for (int c = 0; c < kColumns; ++c)
      if (lane + 32 * c < d) top_out[row * d + lane + 32 * c] = acc[c] * inv;
    if (lane == 0) lse[row] = softmax_rule::log_sum_exp(m, l);
  }
}

__global__ void topkey_backward_kernel(float* dq, float* dk, float* dv, const float* d_top, const float* q,
                                       const float* k, const float* v, const int32_t* top, const int32_t* assign,
                                       const float* top_out, const float* lse, int N, int C, int K, int d,
                                       float scale) {
  const int bh = blockIdx.x / C, j = blockIdx.x % C;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int32_t* keys = top + (bh * C + j) * K;
  CAST_DYNAMIC_SHARED(float, acc, 2 * K * d);  // dK_T, then dV_T, of this cluster
  for (int e = threadIdx.x; e < 2 * K * d; e += blockDim.x) acc[e] = 0.f;
  __syncthreads();
  for (int i = warp; i < N; i += warps) {
    const int row = bh * N + i;
    if (assign[row] != j || lse[row] == softmax_rule::masked<float>()) continue;  // not a member, or a row with no key
    float qi[kColumns], gi[kColumns], dqi[kColumns];
    load_lane_row(qi, q + row * d, d, lane);
    load_lane_row(gi, d_top + row * d, d, lane);
    const float delta = warp_dot(gi, top_out + row * d, d, lane);  // Σ_t p_t dp_t
#pragma unroll
    for (int c = 0; c < kColumns; ++c) dqi[c] = 0.f;
    for (int t = 0; t < K; ++t) {
      const int key = keys[t];
      if (key < 0 || key >= N) continue;
      const float* kr = k + (bh * N + key) * d;
      const float p = softmax_rule::probability(warp_dot(qi, kr, d, lane) * scale, true, lse[row]);
      const float ds = softmax_rule::score_gradient(p, warp_dot(gi, v + (bh * N + key) * d, d, lane), delta) * scale;
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        const int e = lane + 32 * c;
        if (e >= d) continue;
        dqi[c] += ds * kr[e];
        if (dk) acc.atomic_add(t * d + e, ds * qi[c]);
        if (dv) acc.atomic_add((K + t) * d + e, p * gi[c]);
      }
    }
    if (dq)
#pragma unroll
      for (int c = 0; c < kColumns; ++c)
        if (lane + 32 * c < d) dq[row * d + lane + 32 * c] += dqi[c];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < K * d; e += blockDim.x) {
    const int key = keys[e / d];
    if (key < 0 || key >= N) continue;
    const float dk_share = acc[e], dv_share = acc[K * d + e];
    if (dk) atomicAdd(dk + (bh * N + key) * d + e % d, dk_share);
    if (dv) atomicAdd(dv + (bh * N + key) * d + e % d, dv_share);
  }
}

}  // namespace

bool topkey_attention_fits(int64_t top, int64_t d) { return d <= kTopKeyMaxHead && 2 * top * d <= kSharedFloats; }

void topkey_attention_forward(Tensor& top_out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& top, const Tensor& assign, int64_t clusters, int64_t k_top, double scale) {
  const int64_t BH = q.dim(0), N = q.dim(1), d = q.dim(2);
  CAST_CHECK(topkey_attention_fits(k_top, d), "top-key attention: {} keys of width {} do not fit", k_top, d);
  CAST_CHECK(BH * N * d <= int64_t{INT32_MAX} && BH * clusters * k_top <= int64_t{INT32_MAX},
             "top-key attention: {} rows of width {} exceed 32-bit indexing", BH * N, d);
  if (BH * N == 0) return;
  CAST_LAUNCH(topkey_forward_kernel, blocks_for(BH * N, kWarpThreads / 32), kWarpThreads, 0, fptr(top_out), fptr(lse),
              fptr(q), fptr(k), fptr(v), top.data<int32_t>(), assign.data<int32_t>(), static_cast<int>(BH),
              static_cast<int>(N), static_cast<int>(clusters), static_cast<int>(k_top), static_cast<int>(d),
              static_cast<float>(scale));
  CUDA_CHECK_LAUNCH();
}

void topkey_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& d_top, const Tensor& q,
                               const Tensor& k, const Tensor& v, const Tensor& top, const Tensor& assign,
                               const Tensor& top_out, const Tensor& lse, int64_t clusters, int64_t k_top,
                               double scale) {
  const int64_t BH = q.dim(0), N = q.dim(1), d = q.dim(2);
  if (BH * clusters == 0 || (!dq && !dk && !dv)) return;
  CAST_CHECK(BH * clusters <= int64_t{INT32_MAX}, "top-key attention: {} clusters is more than one launch takes",
             BH * clusters);
  CAST_LAUNCH(topkey_backward_kernel, static_cast<unsigned>(BH * clusters), kBackwardThreads,
              static_cast<size_t>(2 * k_top * d) * sizeof(float), dq ? fptr(*dq) : nullptr, dk ? fptr(*dk) : nullptr,
              dv ? fptr(*dv) : nullptr, fptr(d_top), fptr(q), fptr(k), fptr(v), top.data<int32_t>(),
              assign.data<int32_t>(), fptr(top_out), fptr(lse), static_cast<int>(N), static_cast<int>(clusters),
              static_cast<int>(k_top), static_cast<int>(d), static_cast<float>(scale));
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
