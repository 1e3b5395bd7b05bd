// Improved clustered attention's top-key term, fused (cuda/topkey_attention.h).
//
// Forward: one thread per query, an online softmax over its cluster's filled top-key slots,
// the key and value rows read where they are (a cluster's k rows stay in cache across its
// members); nothing of size N·k·d is stored. Backward: one block per (head, cluster); each member
// query (found by scanning the assignment in tiles) recomputes its probabilities from the saved
// log-sum-exp, writes its own dq row and adds its dK_T, dV_T shares into shared memory; the block
// then adds the cluster's k rows into dk and dv (atomics: one key can be in several clusters'
// lists).
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/topkey_attention.h"

namespace cast::cuda {

namespace {

constexpr int kBackwardThreads = 128;
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // the default shared memory of a block

__device__ float dot_rows(const float* a, const float* b, int64_t d) {
  float s = 0;
  for (int64_t e = 0; e < d; ++e) s += a[e] * b[e];
  return s;
}

__global__ void topkey_forward_kernel(float* top_out, float* lse, const float* q, const float* k, const float* v,
                                      const int32_t* top, const int32_t* assign, int64_t BH, int64_t N, int64_t C,
                                      int64_t K, int64_t d, float scale) {
  CAST_KERNEL_LOOP(row, BH * N) {
    const int64_t bh = row / N, j = assign[row];
    float* y = top_out + row * d;
    float acc[kTopKeyMaxHead];
    for (int64_t e = 0; e < d; ++e) acc[e] = 0.f;
    float m = -INFINITY, l = 0.f;
    if (j >= 0 && j < C) {
      const float* qi = q + row * d;
      const int32_t* keys = top + (bh * C + j) * K;
      for (int64_t t = 0; t < K; ++t) {
        const int64_t key = keys[t];
        if (key < 0 || key >= N) continue;  // an empty slot (a bad id is reported by the op's check)
        const float s = dot_rows(qi, k + (bh * N + key) * d, d) * scale;
        const float m_new = fmaxf(m, s);
        const float correction = expf(m - m_new), p = expf(s - m_new);
        const float* vr = v + (bh * N + key) * d;
        for (int64_t e = 0; e < d; ++e) acc[e] = acc[e] * correction + p * vr[e];
        l = l * correction + p;
        m = m_new;
      }
    }
    for (int64_t e = 0; e < d; ++e) y[e] = l > 0.f ? acc[e] / l : 0.f;
    lse[row] = l > 0.f ? m + logf(l) : -INFINITY;
  }
}

__global__ void topkey_backward_kernel(float* dq, float* dk, float* dv, const float* d_top, const float* q,
                                       const float* k, const float* v, const int32_t* top, const int32_t* assign,
                                       const float* top_out, const float* lse, int64_t N, int64_t C, int64_t K,
                                       int64_t d, float scale) {
  const int64_t bh = blockIdx.x / C, j = blockIdx.x % C;
  const int32_t* keys = top + (bh * C + j) * K;
  CAST_DYNAMIC_SHARED(float, acc, 2 * K * d);  // dK_T, then dV_T, of this cluster
  for (int64_t e = threadIdx.x; e < 2 * K * d; e += blockDim.x) acc[e] = 0.f;
  __syncthreads();
  for (int64_t base = 0; base < N; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    if (i >= N || assign[bh * N + i] != j || !(lse[bh * N + i] > -INFINITY)) continue;
    const int64_t row = bh * N + i;
    const float *qi = q + row * d, *gi = d_top + row * d;
    const float delta = dot_rows(gi, top_out + row * d, d);  // Σ_t p_t dp_t
    float* dqi = dq ? dq + row * d : nullptr;
    for (int64_t t = 0; t < K; ++t) {
      const int64_t key = keys[t];
      if (key < 0 || key >= N) continue;
      const float* kr = k + (bh * N + key) * d;
      const float p = expf(dot_rows(qi, kr, d) * scale - lse[row]);
      const float ds = p * (dot_rows(gi, v + (bh * N + key) * d, d) - delta) * scale;
      for (int64_t e = 0; e < d; ++e) {
        if (dqi) dqi[e] += ds * kr[e];
        if (dk) acc.atomic_add(t * d + e, ds * qi[e]);
        if (dv) acc.atomic_add((K + t) * d + e, p * gi[e]);
      }
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < K * d; e += blockDim.x) {
    const int64_t key = keys[e / d];
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
  if (BH * N == 0) return;
  CAST_LAUNCH(topkey_forward_kernel, blocks_for(BH * N), kThreads, 0, fptr(top_out), fptr(lse), fptr(q), fptr(k),
              fptr(v), top.data<int32_t>(), assign.data<int32_t>(), BH, N, clusters, k_top, d,
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
              assign.data<int32_t>(), fptr(top_out), fptr(lse), N, clusters, k_top, d, static_cast<float>(scale));
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
