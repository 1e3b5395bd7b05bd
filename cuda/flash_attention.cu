// Full attention without an M×N matrix on the GPU, the same algorithm as the CPU's
// ops/flash_attention.cpp. A block of 32 threads owns 32 rows (queries in the forward and in
// dQ, keys in dK/dV), one row per thread held in registers; the other side streams through
// shared memory in tiles of 32 rows. Forward: an online softmax per query (running max m, sum
// l, output rescaled as m grows), saving only L = m + log l. Backward: Δ_i = Σ_e dO_ie O_ie,
// then each score recomputed as P = exp(S − L): dQ += P(dP − Δ) K/√d per query thread; dV +=
// Pᵀ dO and dK += (P(dP − Δ))ᵀ Q/√d per key thread. Nothing of size M×N exists.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/flash_attention.h"
#include "cuda/launch.cuh"

namespace cast::cuda {

namespace {

constexpr int kTile = 32;      // rows per block and per streamed tile
constexpr int kMaxWidth = 128;  // the head width d a thread's registers hold

struct Shape4 {
  int64_t B, H, M, N, d;
  float scale;
};

// Keys j0 .. j0 + rows of head bh into shared memory: K then V (kTile × d each, zeros past the
// end) and which of them are real. Between two barriers: the previous tile is read no more.
__device__ void load_key_tile(SharedArray<float>& kv, SharedArray<float>& real, const float* k, const float* v,
                              const float* mask, int64_t bh, int64_t b, int64_t j0, int64_t rows, const Shape4& s) {
  __syncthreads();
  for (int64_t e = threadIdx.x; e < kTile * s.d; e += blockDim.x) {
    kv[e] = e / s.d < rows ? k[(bh * s.N + j0) * s.d + e] : 0.f;
    kv[kTile * s.d + e] = e / s.d < rows ? v[(bh * s.N + j0) * s.d + e] : 0.f;
  }
  for (int64_t t = threadIdx.x; t < kTile; t += blockDim.x)
    real[t] = t < rows && (!mask || mask[b * s.N + j0 + t] != 0.f) ? 1.f : 0.f;
  __syncthreads();
}

__global__ void flash_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                                     const float* mask, Shape4 s) {
  CAST_DYNAMIC_SHARED(float, kv, 2 * kTile * s.d);  // K tile, then V tile
  CAST_SHARED_ARRAY(float, real, kTile);
  const int64_t bh = blockIdx.y, b = bh / s.H, i = blockIdx.x * static_cast<int64_t>(kTile) + threadIdx.x;
  const bool active = i < s.M;
  float qi[kMaxWidth], acc[kMaxWidth];
  for (int64_t e = 0; e < s.d; ++e) {
    qi[e] = active ? q[(bh * s.M + i) * s.d + e] : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = 0; j0 < s.N; j0 += kTile) {
    const int64_t rows = s.N - j0 < kTile ? s.N - j0 : kTile;
    load_key_tile(kv, real, k, v, mask, bh, b, j0, rows, s);
    if (!active) continue;
    for (int64_t t = 0; t < rows; ++t) {
      if (real[t] == 0.f) continue;
      float dot = 0.f;
      for (int64_t e = 0; e < s.d; ++e) dot += qi[e] * kv[t * s.d + e];
      const float score = dot * s.scale;
      if (score > m) {  // a new maximum: rescale what was summed so far
        const float correction = m == -INFINITY ? 0.f : expf(m - score);
        l *= correction;
        for (int64_t e = 0; e < s.d; ++e) acc[e] *= correction;
        m = score;
      }
      const float p = expf(score - m);
      l += p;
      for (int64_t e = 0; e < s.d; ++e) acc[e] += p * kv[kTile * s.d + t * s.d + e];
    }
  }
  if (!active) return;
  float* o = out + (bh * s.M + i) * s.d;
  if (l == 0.f) {  // no real key: zeros, as the reference softmax
    for (int64_t e = 0; e < s.d; ++e) o[e] = 0.f;
    lse[bh * s.M + i] = -INFINITY;
    return;
  }
  for (int64_t e = 0; e < s.d; ++e) o[e] = acc[e] / l;
  lse[bh * s.M + i] = m + logf(l);
}

// Δ_i = Σ_e dO_ie O_ie, one thread per query row.
__global__ void flash_delta_kernel(float* delta, const float* dout, const float* out, int64_t rows, int64_t d) {
  CAST_KERNEL_LOOP(r, rows) {
    float sum = 0.f;
    for (int64_t e = 0; e < d; ++e) sum += dout[r * d + e] * out[r * d + e];
    delta[r] = sum;
  }
}

__global__ void flash_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v,
                                const float* mask, const float* lse, const float* delta, Shape4 s) {
  CAST_DYNAMIC_SHARED(float, kv, 2 * kTile * s.d);
  CAST_SHARED_ARRAY(float, real, kTile);
  const int64_t bh = blockIdx.y, b = bh / s.H, i = blockIdx.x * static_cast<int64_t>(kTile) + threadIdx.x;
  const bool active = i < s.M;
  float qi[kMaxWidth], gi[kMaxWidth], acc[kMaxWidth];
  for (int64_t e = 0; e < s.d; ++e) {
    qi[e] = active ? q[(bh * s.M + i) * s.d + e] : 0.f;
    gi[e] = active ? dout[(bh * s.M + i) * s.d + e] : 0.f;
    acc[e] = 0.f;
  }
  const float li = active ? lse[bh * s.M + i] : -INFINITY, di = active ? delta[bh * s.M + i] : 0.f;
  for (int64_t j0 = 0; j0 < s.N; j0 += kTile) {
    const int64_t rows = s.N - j0 < kTile ? s.N - j0 : kTile;
    load_key_tile(kv, real, k, v, mask, bh, b, j0, rows, s);
    if (!active || li == -INFINITY) continue;
    for (int64_t t = 0; t < rows; ++t) {
      if (real[t] == 0.f) continue;
      float dot = 0.f, dp = 0.f;
      for (int64_t e = 0; e < s.d; ++e) {
        dot += qi[e] * kv[t * s.d + e];
        dp += gi[e] * kv[kTile * s.d + t * s.d + e];
      }
      const float ds = expf(dot * s.scale - li) * (dp - di) * s.scale;
      for (int64_t e = 0; e < s.d; ++e) acc[e] += ds * kv[t * s.d + e];
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < s.d; ++e) dq[(bh * s.M + i) * s.d + e] += acc[e];
}

__global__ void flash_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k,
                                  const float* v, const float* mask, const float* lse, const float* delta, Shape4 s) {
  CAST_DYNAMIC_SHARED(float, qg, 2 * kTile * s.d);  // Q tile, then dO tile
  CAST_SHARED_ARRAY(float, rows_lse, kTile);
  CAST_SHARED_ARRAY(float, rows_delta, kTile);
  const int64_t bh = blockIdx.y, b = bh / s.H, j = blockIdx.x * static_cast<int64_t>(kTile) + threadIdx.x;
  // a padding key takes no probability: its gradients stay as they are
  const bool active = j < s.N && (!mask || mask[b * s.N + j] != 0.f);
  float kj[kMaxWidth], vj[kMaxWidth], dk_acc[kMaxWidth], dv_acc[kMaxWidth];
  for (int64_t e = 0; e < s.d; ++e) {
    kj[e] = active ? k[(bh * s.N + j) * s.d + e] : 0.f;
    vj[e] = active ? v[(bh * s.N + j) * s.d + e] : 0.f;
    dk_acc[e] = dv_acc[e] = 0.f;
  }
  for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
    const int64_t rows = s.M - i0 < kTile ? s.M - i0 : kTile;
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTile * s.d; e += blockDim.x) {
      qg[e] = e / s.d < rows ? q[(bh * s.M + i0) * s.d + e] : 0.f;
      qg[kTile * s.d + e] = e / s.d < rows ? dout[(bh * s.M + i0) * s.d + e] : 0.f;
    }
    for (int64_t t = threadIdx.x; t < kTile; t += blockDim.x) {
      rows_lse[t] = t < rows ? lse[bh * s.M + i0 + t] : -INFINITY;
      rows_delta[t] = t < rows ? delta[bh * s.M + i0 + t] : 0.f;
    }
    __syncthreads();
    if (!active) continue;
    for (int64_t t = 0; t < rows; ++t) {
      const float li = rows_lse[t];
      if (li == -INFINITY) continue;  // a query with no real key
      float dot = 0.f, dp = 0.f;
      for (int64_t e = 0; e < s.d; ++e) {
        dot += qg[t * s.d + e] * kj[e];
        dp += qg[kTile * s.d + t * s.d + e] * vj[e];
      }
      const float p = expf(dot * s.scale - li), ds = p * (dp - rows_delta[t]) * s.scale;
      for (int64_t e = 0; e < s.d; ++e) {
        dv_acc[e] += p * qg[kTile * s.d + t * s.d + e];
        dk_acc[e] += ds * qg[t * s.d + e];
      }
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < s.d; ++e) {
    if (dk) dk[(bh * s.N + j) * s.d + e] += dk_acc[e];
    if (dv) dv[(bh * s.N + j) * s.d + e] += dv_acc[e];
  }
}

Shape4 shape_of(const Tensor& q, const Tensor& k) {
  Shape4 s{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3), 0.f};
  s.scale = 1.f / std::sqrt(static_cast<float>(s.d));
  CAST_CHECK(s.d >= 1 && s.d <= kMaxWidth, "flash_attention on CUDA: head width {} outside [1, {}]", s.d, kMaxWidth);
  CAST_CHECK(s.B * s.H <= 65535, "flash_attention on CUDA: {} batch-heads exceed a grid's 65535", s.B * s.H);
  return s;
}

dim3 grid_for(int64_t rows, const Shape4& s) {
  return dim3(static_cast<unsigned>((rows + kTile - 1) / kTile), static_cast<unsigned>(s.B * s.H));
}

size_t tile_bytes(const Shape4& s) { return 2 * kTile * s.d * sizeof(float); }

}  // namespace

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask) {
  const Shape4 s = shape_of(q, k);
  if (s.B * s.H * s.M == 0) return;
  CAST_LAUNCH(flash_forward_kernel, grid_for(s.M, s), kTile, tile_bytes(s), fptr(out), fptr(lse), fptr(q), fptr(k),
              fptr(v), mask.defined() ? fptr(mask) : nullptr, s);
  CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q,
                              const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& out,
                              const Tensor& lse) {
  const Shape4 s = shape_of(q, k);
  if (s.B * s.H * s.M == 0 || s.N == 0) return;
  Tensor delta = Tensor::empty({s.B, s.H, s.M}, DType::f32, Device::cuda);
  CAST_LAUNCH(flash_delta_kernel, blocks_for(s.B * s.H * s.M), kThreads, 0, fptr(delta), fptr(dout), fptr(out),
              s.B * s.H * s.M, s.d);
  CUDA_CHECK_LAUNCH();
  const float* m = mask.defined() ? fptr(mask) : nullptr;
  if (dq) {
    CAST_LAUNCH(flash_dq_kernel, grid_for(s.M, s), kTile, tile_bytes(s), fptr(*dq), fptr(dout), fptr(q), fptr(k),
                fptr(v), m, fptr(lse), fptr(delta), s);
    CUDA_CHECK_LAUNCH();
  }
  if (dk || dv) {
    CAST_LAUNCH(flash_dkdv_kernel, grid_for(s.N, s), kTile, tile_bytes(s), dk ? fptr(*dk) : nullptr,
                dv ? fptr(*dv) : nullptr, fptr(dout), fptr(q), fptr(k), fptr(v), m, fptr(lse), fptr(delta), s);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace cast::cuda
