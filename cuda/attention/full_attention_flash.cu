// Full attention without an M×N matrix on the GPU: the algorithm of the CPU's
// ops/attention/full_attention_flash.cpp, laid out in the manner of FlashAttention-2 for FP32 FMA units.
//
// A block of 128 threads (4 warps) owns a tile of rows: BM queries in the forward and in dQ,
// BK keys in dK/dV. The other side streams through shared memory in tiles, filled with 128-bit
// loads. Thread (ty, tx) = (tid / 8, tid % 8) holds in registers
//   * a score tile: its RT rows × the columns tx, tx + 8, tx + 16, ... of the streamed tile;
//   * an output tile: its RT rows × the head columns 32g + 4tx .. 32g + 4tx + 3 (g < D / 32).
// Every shared load feeds 4·RT or 4·CN FMAs (floor.py prints the ratios). The 8 threads of a
// row are 8 neighbouring lanes of one warp, so a row's max and sum are three shuffles.
// Probabilities go through shared memory between the two products (S = QKᵀ, then O += PV).
//
// The head width d is a run-time value up to a compiled bound D ∈ {32, 64, 128}: columns past d
// load as zeros and are never stored, so every d in [1, 128] runs on the smallest D ≥ d.
//
// Forward: an online softmax per query row (running max m and sum l, the output rescaled as m
// grows), saving L = m + log l. Backward (FlashAttention-2's split, with no atomics, so a step
// gives the same bits every time): Δ_i = Σ_e dO_ie O_ie; then one kernel over key blocks
// recomputes P = exp(S − L) and dS = P ⊙ (dP − Δ) tile by tile and accumulates dV += Pᵀ dO and
// dK += dSᵀ Q in registers; another over query blocks recomputes them again and accumulates
// dQ += dS K. Recomputing S and dP twice costs 2 of the backward's 7 tile products; atomics on
// dQ would make it nondeterministic.
//
// The masked-row rule is math/softmax_rule.h's, as in the reference softmax: padding keys take no
// probability; a row with no real key outputs zeros with L = −∞ and passes no gradient; a NaN
// among a row's real scores makes the whole row NaN (fmaxf skips it in the max, exp carries it),
// padding keys still taking 0; NaN in a padding row reaches what the reference's products reach.
#include <cmath>

#include "math/softmax_rule.h"
#include "cuda/common.cuh"
#include "cuda/attention/full_attention_flash.h"
#include "cuda/launch.cuh"

namespace cast::cuda {

namespace {

constexpr int kBlock = 128;  // 4 warps
constexpr int kLanesPerRow = 8;
constexpr int kRowGroups = kBlock / kLanesPerRow;  // 16

// One kernel's tile shape for the head-width bound D: RT rows per thread (16·RT rows per block),
// CN streamed columns per thread (8·CN rows per streamed tile).
template <int D, int RT_, int CN_>
struct Tile {
  static constexpr int kD = D, RT = RT_, CN = CN_;
  static constexpr int kRows = kRowGroups * RT;      // rows a block owns
  static constexpr int kStream = kLanesPerRow * CN;  // rows of each streamed tile
  static constexpr int kGroups = D / 32;             // float4 column groups per thread
  static constexpr int kRowStride = D + 4;           // padded: 8 rows read at once hit distinct banks
  static constexpr int kProbStride = kStream + 4;    // a multiple of 4, for 128-bit reads
};

// Forward and dQ: 64 query rows per block; 64 keys per streamed tile (32 at D 128, where the
// registers and shared memory of a wider row count twice).
template <int D>
using QueryTile = Tile<D, 4, D == 128 ? 4 : 8>;
// dK/dV: 64 keys per block and 64 or 32 queries per streamed tile (32 keys at D 128).
template <int D>
using KeyTile = Tile<D, D == 128 ? 2 : 4, D == 32 ? 8 : 4>;

// The shape of one call, in 32-bit indices (the host checks that every index fits).
struct FlashShape {
  int heads, M, N, d;
  float scale;
  bool vectors;  // d % 4 == 0 and 16-byte aligned rows: global memory moves as float4
};

__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }
__device__ __forceinline__ int round4(int n) { return (n + 3) & ~3; }

// Whether the calling warp owns any of the block's first `valid` rows (a warp owns 4·RT rows).
// A warp past them skips its products (a partial tile's, or a tiny cluster's): it still reaches
// every barrier, and its shuffles are skipped by all its lanes alike.
template <class T>
__device__ __forceinline__ bool warp_owns_rows(int valid) {
  return static_cast<int>(threadIdx.x / 32) * 4 * T::RT < valid;
}

// `valid` rows of d floats at src (contiguous) into a tile of `rows` padded rows; zeros past d
// and past `valid`, so that unused columns and rows add nothing to a product.
template <int D>
__device__ void load_rows(SharedArray<float>& tile, int tile_base, const float* src, int valid, int rows,
                          const FlashShape& s) {
  constexpr int stride = D + 4, slots = D / 4;
  for (int f = threadIdx.x; f < rows * slots; f += blockDim.x) {
    const int r = f / slots, c = (f % slots) * 4;
    float4 x = zero4();
    if (r < valid && c < s.d) {
      if (s.vectors) {
        x = *reinterpret_cast<const float4*>(src + r * s.d + c);
      } else {
        const float* p = src + r * s.d;
        x.x = p[c];
        x.y = c + 1 < s.d ? p[c + 1] : 0.f;
        x.z = c + 2 < s.d ? p[c + 2] : 0.f;
        x.w = c + 3 < s.d ? p[c + 3] : 0.f;
      }
    }
    tile.store4(tile_base + r * stride + c, x);
  }
}

// acc[r][c] = Σ_e A[a_row + r][e] · B[tx + 8c][e]: this thread's scores (rows of A against the
// streamed rows of B). A's reads are broadcasts within a row's 8 lanes; B's 8 rows land in
// distinct banks through the padded stride.
template <class T>
__device__ __forceinline__ void tile_scores(float (&acc)[T::RT][T::CN], const SharedArray<float>& smem, int a_base,
                                            int a_row, int b_base, int tx, int width) {
  constexpr int stride = T::kRowStride;
#pragma unroll
  for (int r = 0; r < T::RT; ++r)
#pragma unroll
    for (int c = 0; c < T::CN; ++c) acc[r][c] = 0.f;
#pragma unroll 4
  for (int e = 0; e < width; e += 4) {  // width: d rounded up to 4; the columns past it are zeros
    float4 a[T::RT], b[T::CN];
#pragma unroll
    for (int r = 0; r < T::RT; ++r) a[r] = smem.load4(a_base + (a_row + r) * stride + e);
#pragma unroll
    for (int c = 0; c < T::CN; ++c) b[c] = smem.load4(b_base + (tx + kLanesPerRow * c) * stride + e);
#pragma unroll
    for (int r = 0; r < T::RT; ++r)
#pragma unroll
      for (int c = 0; c < T::CN; ++c)
        acc[r][c] += a[r].x * b[c].x + a[r].y * b[c].y + a[r].z * b[c].z + a[r].w * b[c].w;
  }
}

// out[r][g] += Σ_j W[w_row + r][j] · V[j][32g + 4tx ..]: a weighted sum of streamed rows into
// this thread's output tile (W: probabilities or dS, with the prob stride), over the first
// `rows` streamed rows (the valid ones rounded up to 4: the rest are zeros) and the column
// groups that hold any of the `width` columns.
template <class T>
__device__ __forceinline__ void tile_accumulate(float4 (&out)[T::RT][T::kGroups], const SharedArray<float>& smem,
                                                int w_base, int w_row, int v_base, int tx, int rows, int width) {
  constexpr int stride = T::kRowStride, wstride = T::kProbStride;
#pragma unroll 2
  for (int j = 0; j < rows; j += 4) {
    float4 w[T::RT];
#pragma unroll
    for (int r = 0; r < T::RT; ++r) w[r] = smem.load4(w_base + (w_row + r) * wstride + j);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int g = 0; g < T::kGroups; ++g) {
        if (32 * g >= width) break;
        const float4 v = smem.load4(v_base + (j + jj) * stride + 32 * g + 4 * tx);
#pragma unroll
        for (int r = 0; r < T::RT; ++r) {
          const float wr = jj == 0 ? w[r].x : jj == 1 ? w[r].y : jj == 2 ? w[r].z : w[r].w;
          out[r][g].x += wr * v.x;
          out[r][g].y += wr * v.y;
          out[r][g].z += wr * v.z;
          out[r][g].w += wr * v.w;
        }
      }
    }
  }
}

// Max and sum over the 8 lanes of one row (neighbouring lanes of one warp).
__device__ __forceinline__ float row_max(float v) {
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum(float v) {
  for (int o = kLanesPerRow / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether each key of a streamed tile is real: 1 or 0, 0 past the end.
__device__ void load_key_flags(SharedArray<float>& real, int base, const float* mask, int b, int j0, int valid,
                               int rows, const FlashShape& s) {
  for (int t = threadIdx.x; t < rows; t += blockDim.x)
    real[base + t] = t < valid && (!mask || mask[b * s.N + j0 + t] != 0.f) ? 1.f : 0.f;
}

// The streamed key tile j0 .. j0 + k_rows of head bh: K and V rows and the keys' flags, between
// two barriers (the previous tile is read no more; this one is complete for every thread).
template <class T>
__device__ void load_key_tile(SharedArray<float>& smem, int k_base, int v_base, int flag_base, const float* k,
                              const float* v, const float* mask, int bh, int b, int j0, int k_rows,
                              const FlashShape& s) {
  __syncthreads();
  load_rows<T::kD>(smem, k_base, k + (bh * s.N + j0) * s.d, k_rows, T::kStream, s);
  load_rows<T::kD>(smem, v_base, v + (bh * s.N + j0) * s.d, k_rows, T::kStream, s);
  load_key_flags(smem, flag_base, mask, b, j0, k_rows, T::kStream, s);
  __syncthreads();
}

// Adds (or stores) this thread's output tile into rows [row0, row0 + RT) of dst, columns < d;
// each row scaled by divide_by[r] where given.
template <class T>
__device__ void store_rows(float* dst, const float4 (&acc)[T::RT][T::kGroups], int row0, int rows_total,
                           const float* divide_by, bool add, int tx, const FlashShape& s) {
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    const int row = row0 + r;
    if (row >= rows_total) continue;
    const float inv = divide_by ? divide_by[r] : 1.f;
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) {
      const float vals[4] = {acc[r][g].x * inv, acc[r][g].y * inv, acc[r][g].z * inv, acc[r][g].w * inv};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int c = 32 * g + 4 * tx + i;
        if (c >= s.d) continue;
        float& out = dst[row * s.d + c];
        out = add ? out + vals[i] : vals[i];
      }
    }
  }
}

// The online softmax of one streamed tile for this thread's rows: scores of padding keys become
// −∞, the running max m and sum l take the tile in (the output tile rescaled where m grows),
// and the tile's probabilities exp(S − m) go to shared memory for the product with V.
template <class T>
__device__ __forceinline__ void online_softmax(float (&sc)[T::RT][T::CN], float (&m)[T::RT], float (&l)[T::RT],
                                               float4 (&o)[T::RT][T::kGroups], const SharedArray<float>& smem,
                                               int p_base, int flag_base, int row0, int tx, float scale) {
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    float tile_max = softmax_rule::masked<float>();
#pragma unroll
    for (int c = 0; c < T::CN; ++c) {
      sc[r][c] = smem[flag_base + tx + kLanesPerRow * c] != 0.f ? sc[r][c] * scale : softmax_rule::masked<float>();
      tile_max = fmaxf(tile_max, sc[r][c]);
    }
    const float m_new = fmaxf(m[r], row_max(tile_max));
    const float correction = softmax_rule::rescale(m[r], m_new);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < T::CN; ++c) {
      const float p = softmax_rule::weight(sc[r][c], m_new);
      smem[p_base + (row0 + r) * T::kProbStride + tx + kLanesPerRow * c] = p;
      sum += p;
    }
    l[r] = l[r] * correction + row_sum(sum);
    m[r] = m_new;
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) {
      o[r][g].x *= correction, o[r][g].y *= correction, o[r][g].z *= correction, o[r][g].w *= correction;
    }
  }
}

// ---------------------------------------------------------------- forward
// Shared: Q tile (BM rows), K tile, V tile (BN rows each), probabilities (BM × BN), key flags.
template <class T>
constexpr int forward_floats() {
  return (T::kRows + 2 * T::kStream) * T::kRowStride + T::kRows * T::kProbStride + T::kStream;
}

template <class T>
__global__ void __launch_bounds__(kBlock) flash_forward_kernel(float* out, float* lse, const float* q, const float* k,
                                                               const float* v, const float* mask, FlashShape s) {
  constexpr int BM = T::kRows, BN = T::kStream, stride = T::kRowStride;
  constexpr int q_base = 0, k_base = BM * stride, v_base = k_base + BN * stride, p_base = v_base + BN * stride,
                flag_base = p_base + BM * T::kProbStride;
  CAST_DYNAMIC_SHARED(float, smem, forward_floats<T>());
  const int tx = threadIdx.x % kLanesPerRow, ty = threadIdx.x / kLanesPerRow, row0 = ty * T::RT;
  const int bh = blockIdx.y, b = bh / s.heads, i0 = blockIdx.x * BM;
  const int q_rows = s.M - i0 < BM ? s.M - i0 : BM;
  const bool live = warp_owns_rows<T>(q_rows);
  load_rows<T::kD>(smem, q_base, q + (bh * s.M + i0) * s.d, q_rows, BM, s);

  float4 o[T::RT][T::kGroups];
  float m[T::RT], l[T::RT];
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    m[r] = softmax_rule::masked<float>(), l[r] = 0.f;
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) o[r][g] = zero4();
  }
  for (int j0 = 0; j0 < s.N; j0 += BN) {
    const int k_rows = s.N - j0 < BN ? s.N - j0 : BN;
    load_key_tile<T>(smem, k_base, v_base, flag_base, k, v, mask, bh, b, j0, k_rows, s);
    if (live) {
      float sc[T::RT][T::CN];
      tile_scores<T>(sc, smem, q_base, row0, k_base, tx, round4(s.d));
      online_softmax<T>(sc, m, l, o, smem, p_base, flag_base, row0, tx, s.scale);
    }
    __syncthreads();
    if (live) tile_accumulate<T>(o, smem, p_base, row0, v_base, tx, round4(k_rows), s.d);
  }
  float inv[T::RT];
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    inv[r] = softmax_rule::inverse_sum(l[r]);  // no real key: zeros, as the reference softmax
    const int row = i0 + row0 + r;
    if (tx == 0 && row < s.M) lse[bh * s.M + row] = softmax_rule::log_sum_exp(m[r], l[r]);
  }
  store_rows<T>(out + bh * s.M * s.d, o, i0 + row0, s.M, inv, false, tx, s);
}

// Δ_i = Σ_e dO_ie O_ie: one warp per row, lanes over the head columns.
__global__ void flash_delta_kernel(float* delta, const float* dout, const float* out, int rows, int d) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
    float sum = 0.f;
    for (int e = lane; e < d; e += 32) sum += dout[r * d + e] * out[r * d + e];
    sum = warp_sum(sum);
    if (lane == 0) delta[r] = sum;
  }
}

// Where Δ_i = dO_i · O_i is not finite, Δ_i again as the reference's softmax backward forms it,
// Σ_j P_ij dP_ij over the real keys only: a padding key's NaN value makes O_i NaN (0 · NaN, as
// in the reference's output) but must not reach Δ. One warp per row; a finite Δ (every row but
// in such a case) costs one read.
__global__ void flash_delta_real_keys_kernel(float* delta, const float* dout, const float* q, const float* k,
                                             const float* v, const float* mask, const float* lse, FlashShape s,
                                             int rows) {
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += gridDim.x * warps) {
    if (delta[r] - delta[r] == 0.f) continue;  // finite (the same in every lane: the warp stays together)
    const int bh = r / s.M, b = bh / s.heads;
    float sum = 0.f;
    for (int j = 0; j < s.N; ++j) {
      if (mask && mask[b * s.N + j] == 0.f) continue;
      float qk = 0.f, gv = 0.f;
      for (int e = lane; e < s.d; e += 32) {
        qk += q[r * s.d + e] * k[(bh * s.N + j) * s.d + e];
        gv += dout[r * s.d + e] * v[(bh * s.N + j) * s.d + e];
      }
      sum += softmax_rule::probability(warp_sum(qk) * s.scale, true, lse[r]) * warp_sum(gv);
    }
    if (lane == 0) delta[r] = sum;
  }
}

// ---------------------------------------------------------------- dQ
// Shared: Q and dO tiles (BM rows), K and V tiles (BN rows), dS (BM × BN), key flags.
template <class T>
constexpr int dq_floats() {
  return (2 * T::kRows + 2 * T::kStream) * T::kRowStride + T::kRows * T::kProbStride + T::kStream;
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    flash_dq_kernel(float* dq, const float* dout, const float* q, const float* k, const float* v, const float* mask,
                    const float* lse, const float* delta, FlashShape s) {
  constexpr int BM = T::kRows, BN = T::kStream, stride = T::kRowStride;
  constexpr int q_base = 0, g_base = BM * stride, k_base = 2 * BM * stride, v_base = k_base + BN * stride,
                ds_base = v_base + BN * stride, flag_base = ds_base + BM * T::kProbStride;
  CAST_DYNAMIC_SHARED(float, smem, dq_floats<T>());
  const int tx = threadIdx.x % kLanesPerRow, ty = threadIdx.x / kLanesPerRow, row0 = ty * T::RT;
  const int bh = blockIdx.y, b = bh / s.heads, i0 = blockIdx.x * BM;
  const int q_rows = s.M - i0 < BM ? s.M - i0 : BM;
  const bool live = warp_owns_rows<T>(q_rows);
  load_rows<T::kD>(smem, q_base, q + (bh * s.M + i0) * s.d, q_rows, BM, s);
  load_rows<T::kD>(smem, g_base, dout + (bh * s.M + i0) * s.d, q_rows, BM, s);
  float L[T::RT], Dl[T::RT];
  float4 acc[T::RT][T::kGroups];
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    const int row = i0 + row0 + r;
    L[r] = row < s.M ? lse[bh * s.M + row] : softmax_rule::masked<float>();
    Dl[r] = row < s.M ? delta[bh * s.M + row] : 0.f;
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) acc[r][g] = zero4();
  }
  for (int j0 = 0; j0 < s.N; j0 += BN) {
    const int k_rows = s.N - j0 < BN ? s.N - j0 : BN;
    load_key_tile<T>(smem, k_base, v_base, flag_base, k, v, mask, bh, b, j0, k_rows, s);
    if (live) {
      float sc[T::RT][T::CN], dp[T::RT][T::CN];
      tile_scores<T>(sc, smem, q_base, row0, k_base, tx, round4(s.d));
      tile_scores<T>(dp, smem, g_base, row0, v_base, tx, round4(s.d));
#pragma unroll
      for (int r = 0; r < T::RT; ++r)
#pragma unroll
        for (int c = 0; c < T::CN; ++c) {  // dS = P ⊙ (dP − Δ), 0 at padding keys and for rows with none real
          const bool real = smem[flag_base + tx + kLanesPerRow * c] != 0.f && L[r] != softmax_rule::masked<float>();
          const float p = softmax_rule::probability(sc[r][c] * s.scale, real, L[r]);
          smem[ds_base + (row0 + r) * T::kProbStride + tx + kLanesPerRow * c] =
              real ? softmax_rule::score_gradient(p, dp[r][c], Dl[r]) * s.scale : 0.f;
        }
    }
    __syncthreads();
    if (live) tile_accumulate<T>(acc, smem, ds_base, row0, k_base, tx, round4(k_rows), s.d);
  }
  store_rows<T>(dq + bh * s.M * s.d, acc, i0 + row0, s.M, nullptr, true, tx, s);
}

// ---------------------------------------------------------------- dK, dV
// Shared: this block's K and V (BK rows), the streamed Q and dO tiles (BQ rows), Pᵀ and dSᵀ
// (BK × BQ), the streamed rows' L and Δ.
template <class T>
constexpr int dkdv_floats() {
  return (2 * T::kRows + 2 * T::kStream) * T::kRowStride + 2 * T::kRows * T::kProbStride + 2 * T::kStream;
}

template <class T>
__global__ void __launch_bounds__(kBlock)
    flash_dkdv_kernel(float* dk, float* dv, const float* dout, const float* q, const float* k, const float* v,
                      const float* mask, const float* lse, const float* delta, FlashShape s) {
  constexpr int BK = T::kRows, BQ = T::kStream, stride = T::kRowStride, pstride = T::kProbStride;
  constexpr int k_base = 0, v_base = BK * stride, q_base = 2 * BK * stride, g_base = q_base + BQ * stride,
                p_base = g_base + BQ * stride, ds_base = p_base + BK * pstride, lse_base = ds_base + BK * pstride,
                delta_base = lse_base + BQ;
  CAST_DYNAMIC_SHARED(float, smem, dkdv_floats<T>());
  const int tx = threadIdx.x % kLanesPerRow, ty = threadIdx.x / kLanesPerRow, row0 = ty * T::RT;
  const int bh = blockIdx.y, b = bh / s.heads, j0 = blockIdx.x * BK;
  const int k_rows = s.N - j0 < BK ? s.N - j0 : BK;
  const bool live = warp_owns_rows<T>(k_rows);
  load_rows<T::kD>(smem, k_base, k + (bh * s.N + j0) * s.d, k_rows, BK, s);
  load_rows<T::kD>(smem, v_base, v + (bh * s.N + j0) * s.d, k_rows, BK, s);
  bool real[T::RT];
  float4 dk_acc[T::RT][T::kGroups], dv_acc[T::RT][T::kGroups];
#pragma unroll
  for (int r = 0; r < T::RT; ++r) {
    const int j = j0 + row0 + r;
    real[r] = j < s.N && (!mask || mask[b * s.N + j] != 0.f);
#pragma unroll
    for (int g = 0; g < T::kGroups; ++g) dk_acc[r][g] = dv_acc[r][g] = zero4();
  }
  for (int i0 = 0; i0 < s.M; i0 += BQ) {
    const int q_rows = s.M - i0 < BQ ? s.M - i0 : BQ;
    __syncthreads();
    load_rows<T::kD>(smem, q_base, q + (bh * s.M + i0) * s.d, q_rows, BQ, s);
    load_rows<T::kD>(smem, g_base, dout + (bh * s.M + i0) * s.d, q_rows, BQ, s);
    for (int t = threadIdx.x; t < BQ; t += blockDim.x) {
      smem[lse_base + t] = t < q_rows ? lse[bh * s.M + i0 + t] : softmax_rule::masked<float>();
      smem[delta_base + t] = t < q_rows ? delta[bh * s.M + i0 + t] : 0.f;
    }
    __syncthreads();
    if (live) {
      float st[T::RT][T::CN], dpt[T::RT][T::CN];  // scores and dP, transposed: keys × queries
      tile_scores<T>(st, smem, k_base, row0, q_base, tx, round4(s.d));
      tile_scores<T>(dpt, smem, v_base, row0, g_base, tx, round4(s.d));
#pragma unroll
      for (int r = 0; r < T::RT; ++r)
#pragma unroll
        for (int c = 0; c < T::CN; ++c) {
          // A query with no real key passes nothing. A padding key takes probability 0 and dS 0
          // (in a NaN row too, as the reference's softmax), multiplied through like the
          // reference's products, so a NaN in Q or dO still reaches it.
          const int i = tx + kLanesPerRow * c;
          const float Li = smem[lse_base + i];
          float p = 0.f, ds = 0.f;
          if (Li != softmax_rule::masked<float>() && real[r]) {
            p = softmax_rule::probability(st[r][c] * s.scale, true, Li);
            ds = softmax_rule::score_gradient(p, dpt[r][c], static_cast<float>(smem[delta_base + i])) * s.scale;
          }
          smem[p_base + (row0 + r) * pstride + i] = p;
          smem[ds_base + (row0 + r) * pstride + i] = ds;
        }
    }
    __syncthreads();
    if (live) {
      tile_accumulate<T>(dv_acc, smem, p_base, row0, g_base, tx, round4(q_rows), s.d);
      tile_accumulate<T>(dk_acc, smem, ds_base, row0, q_base, tx, round4(q_rows), s.d);
    }
  }
  if (dk) store_rows<T>(dk + bh * s.N * s.d, dk_acc, j0 + row0, s.N, nullptr, true, tx, s);
  if (dv) store_rows<T>(dv + bh * s.N * s.d, dv_acc, j0 + row0, s.N, nullptr, true, tx, s);
}

// ---------------------------------------------------------------- host side
FlashShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  const int64_t B = q.dim(0), H = q.dim(1), M = q.dim(2), N = k.dim(2), d = q.dim(3);
  CAST_CHECK(d >= 1 && d <= 128, "flash_attention on CUDA: head width {} outside [1, 128]", d);
  CAST_CHECK(B * H * std::max(M, N) * d <= int64_t{INT32_MAX},
             "flash_attention on CUDA: {} x {} rows of width {} exceed 32-bit indexing", B * H, std::max(M, N), d);
  const auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data<float>()) % 16 == 0; };
  FlashShape s{static_cast<int>(H),
               static_cast<int>(M),
               static_cast<int>(N),
               static_cast<int>(d),
               1.f / std::sqrt(static_cast<float>(d)),
               false};
  s.vectors = d % 4 == 0 && aligned(q) && aligned(k) && aligned(v) && (!out.defined() || aligned(out));
  return s;
}

template <class T>
dim3 grid_for(int rows, int64_t batch_heads) {
  return dim3(static_cast<unsigned>((rows + T::kRows - 1) / T::kRows), static_cast<unsigned>(batch_heads));
}

// Launches kernel with `floats` of dynamic shared memory, opting in past 48 KiB once per kernel.
template <class... Params, class... Args>
void launch_tiled(const char* name, void (*kernel)(Params...), dim3 grid, int floats, Args&&... args) {
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  launch_kernel(name, kernel, grid, dim3(kBlock), bytes, std::forward<Args>(args)...);
  CUDA_CHECK_LAUNCH();
}

// Calls fn with the compiled head-width bound for d: 32, 64 or 128.
template <class Fn>
void with_width(int d, Fn&& fn) {
  if (d <= 32) fn(std::integral_constant<int, 32>{});
  else if (d <= 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

template <class T>
std::string tile_name(const char* kernel) {
  return fmt::format("{}<Tile<{}, {}, {}>>", kernel, T::kD, T::RT, T::CN);
}

}  // namespace

std::vector<KernelLaunchShape> flash_launch_shapes() {
  std::vector<KernelLaunchShape> shapes;
  for (int d : {32, 64, 128})
    with_width(d, [&](auto width) {
      constexpr int D = decltype(width)::value;
      using Q = QueryTile<D>;
      using K = KeyTile<D>;
      shapes.push_back({tile_name<Q>("flash_forward_kernel"), kBlock, forward_floats<Q>() * sizeof(float)});
      shapes.push_back({tile_name<Q>("flash_dq_kernel"), kBlock, dq_floats<Q>() * sizeof(float)});
      shapes.push_back({tile_name<K>("flash_dkdv_kernel"), kBlock, dkdv_floats<K>() * sizeof(float)});
    });
  for (auto& shape : flash_tc_launch_shapes()) shapes.push_back(std::move(shape));
  return shapes;
}

const char* flash_kernel_name(FlashKernel kernel) {
  switch (kernel) {
    case FlashKernel::tf32x3: return "tf32x3";
    case FlashKernel::tf32: return "tf32";
    case FlashKernel::bf16: return "bf16";
    default: return "fma";
  }
}

FlashKernel parse_flash_kernel(const std::string& name) {
  for (FlashKernel k : {FlashKernel::fma, FlashKernel::tf32x3, FlashKernel::tf32, FlashKernel::bf16})
    if (name == flash_kernel_name(k)) return k;
  throw UsageError(fmt::format("flash kernel '{}' is not one of fma, tf32x3, tf32, bf16", name));
}

const char* flash_backward_name(FlashBackward backward) {
  switch (backward) {
    case FlashBackward::fused: return "fused";
    case FlashBackward::fused_atomic: return "fused-atomic";
    default: return "split";
  }
}

FlashBackward parse_flash_backward(const std::string& name) {
  for (FlashBackward b : {FlashBackward::split, FlashBackward::fused, FlashBackward::fused_atomic})
    if (name == flash_backward_name(b)) return b;
  throw UsageError(fmt::format("flash backward '{}' is not one of split, fused, fused-atomic", name));
}

namespace {
FlashKernel g_fp32_kernel = kFp32FlashKernel;
}

void set_flash_grid_y_limit(int64_t limit) {
  CAST_CHECK(limit >= 1 && limit <= 65535, "flash attention: a launch of {} batch-heads (1 to 65535)", limit);
  g_grid_y_limit = limit;
}

void set_fp32_flash_kernel(FlashKernel kernel) {
  CAST_CHECK(kernel == FlashKernel::fma || kernel == FlashKernel::tf32x3,
             "flash attention: --precision fp32 runs fma or tf32x3, not {}", flash_kernel_name(kernel));
  g_fp32_kernel = kernel;
}

FlashKernel flash_kernel_for(Precision precision) {
  switch (precision) {
    case Precision::tf32: return FlashKernel::tf32;
    case Precision::bf16: return FlashKernel::bf16;
    default: return g_fp32_kernel;
  }
}

FlashKernel flash_kernel_that_runs(FlashKernel kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& dout) {
  if (kernel == FlashKernel::tf32 || kernel == FlashKernel::tf32x3) {
    const auto aligned = [](const Tensor& t) {
      return !t.defined() || reinterpret_cast<uintptr_t>(t.data<float>()) % 16 == 0;
    };
    if (q.dim(3) % 4 != 0 || !aligned(q) || !aligned(k) || !aligned(v) || !aligned(dout)) return FlashKernel::fma;
  }
  // tiles this GPU's shared memory cannot hold (the split kernel's beyond width 64 anywhere, at
  // width 64 on sm_86 and sm_89)
  if (kernel != FlashKernel::fma && !flash_tc_fits(kernel, static_cast<int>(q.dim(3)))) return FlashKernel::fma;
  return kernel;
}

void flash_attention_forward(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& mask, FlashKernel kernel) {
  const FlashShape s = shape_of(q, k, v, out);
  const int64_t BH = q.dim(0) * q.dim(1);
  if (BH * s.M == 0) return;
  kernel = flash_kernel_that_runs(kernel, q, k, v);
  if (kernel != FlashKernel::fma) return flash_tc_forward(kernel, out, lse, q, k, v, mask);
  const float* m = mask.defined() ? fptr(mask) : nullptr;
  with_width(s.d, [&](auto width) {
    using T = QueryTile<decltype(width)::value>;
    for_grid_y_chunks(BH, s.heads, [&](int64_t first, int64_t count) {
      const int64_t qo = first * s.M * s.d, ko = first * s.N * s.d;
      launch_tiled("flash_forward_kernel", flash_forward_kernel<T>, grid_for<T>(s.M, count), forward_floats<T>(),
                   fptr(out) + qo, fptr(lse) + first * s.M, fptr(q) + qo, fptr(k) + ko, fptr(v) + ko,
                   m ? m + first / s.heads * s.N : nullptr, s);
    });
  });
}

void flash_attention_backward(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& mask, const Tensor& out, const Tensor& lse,
                              FlashKernel kernel) {
  FlashShape s = shape_of(q, k, v, out);
  s.vectors = s.vectors && reinterpret_cast<uintptr_t>(dout.data<float>()) % 16 == 0;
  const int64_t BH = q.dim(0) * q.dim(1);
  if (BH * s.M == 0 || s.N == 0) return;
  Tensor delta = Tensor::empty({q.dim(0), q.dim(1), s.M}, DType::f32, Device::cuda);
  const int rows = static_cast<int>(BH * s.M);
  CAST_LAUNCH(flash_delta_kernel, blocks_for(rows, kThreads / 32), kThreads, 0, fptr(delta), fptr(dout), fptr(out),
              rows, s.d);
  CUDA_CHECK_LAUNCH();
  CAST_LAUNCH(flash_delta_real_keys_kernel, blocks_for(rows, kThreads / 32), kThreads, 0, fptr(delta), fptr(dout),
              fptr(q), fptr(k), fptr(v), mask.defined() ? fptr(mask) : nullptr, fptr(lse), s, rows);
  CUDA_CHECK_LAUNCH();
  kernel = flash_kernel_that_runs(kernel, q, k, v, dout);
  if (kernel != FlashKernel::fma) return flash_tc_backward(kernel, dq, dk, dv, dout, q, k, v, mask, lse, delta);
  const float* m = mask.defined() ? fptr(mask) : nullptr;
  with_width(s.d, [&](auto width) {
    constexpr int D = decltype(width)::value;
    for_grid_y_chunks(BH, s.heads, [&](int64_t first, int64_t count) {
      const int64_t qo = first * s.M * s.d, ko = first * s.N * s.d, ro = first * s.M;
      const float* mc = m ? m + first / s.heads * s.N : nullptr;
      if (dq) {
        using T = QueryTile<D>;
        launch_tiled("flash_dq_kernel", flash_dq_kernel<T>, grid_for<T>(s.M, count), dq_floats<T>(), fptr(*dq) + qo,
                     fptr(dout) + qo, fptr(q) + qo, fptr(k) + ko, fptr(v) + ko, mc, fptr(lse) + ro, fptr(delta) + ro, s);
      }
      if (dk || dv) {
        using T = KeyTile<D>;
        launch_tiled("flash_dkdv_kernel", flash_dkdv_kernel<T>, grid_for<T>(s.N, count), dkdv_floats<T>(),
                     dk ? fptr(*dk) + ko : nullptr, dv ? fptr(*dv) + ko : nullptr, fptr(dout) + qo, fptr(q) + qo,
                     fptr(k) + ko, fptr(v) + ko, mc, fptr(lse) + ro, fptr(delta) + ro, s);
      }
    });
  });
}

}  // namespace cast::cuda
