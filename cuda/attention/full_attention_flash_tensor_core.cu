// Full attention on the tensor cores: the algorithm of cuda/attention/full_attention_flash.cu (and of the CPU's
// ops/attention/full_attention_flash.cpp), with every tile product an mma.sync, in the manner of
// FlashAttention-2. Three kinds of product, one kernel source (the `Math` parameter):
//   Bf16Math    BF16 operands (m16n8k16), FP32 accumulators: `--precision bf16`
//   Tf32Math    TF32 operands (m16n8k8), FP32 accumulators: `--precision tf32`
//   Tf32x3Math  each FP32 operand split into a TF32 high part and a TF32 remainder, three
//               m16n8k8 products (hi·hi + hi·lo + lo·hi): FP32 accuracy on the tensor cores
//               (measured below the FMA kernel's error), as PyTorch's FP32 attention kernels do;
//               `--precision fp32` runs it (below the FMA kernel's error, and faster). Its
//               operands are split once, into copies whose rows hold the high parts and then the
//               remainders ("pair rows"),
//               so that the kernels load both parts by ldmatrix and convert nothing; only the
//               products' own operands (P and dS, from accumulators) are split in registers
// Softmax statistics, the scale, the masked-row and NaN rules (math/softmax_rule.h) stay FP32.
//
// A block is 4 warps; each warp owns 16 rows of the block's tile, or 32 where that fits the
// registers and measured faster (query rows in the forward and in dQ, key rows in dK/dV), and
// keeps its accumulators in the mma's C layout, two rows per thread (g and g + 8). The streamed
// side (keys and values, or queries and output gradients) arrives in shared memory by cp.async,
// two stages deep: the copy of tile j + 1 runs while tile j is multiplied (the split kernel may
// take one buffer instead, TcTile's Stages). Fragments of row-major operands come by ldmatrix;
// the scores' accumulators become the A operand of the next product in registers (P V, dS K,
// Pᵀ dO, dSᵀ Q), with no trip through shared memory.
//
// BF16 reads its operands from BF16 copies made by to_bf16_rows (rows padded to a multiple of 8
// elements, so that any head width moves in 16-byte chunks); TF32 reads the FP32 tensors
// directly, the split kernel its pair-row copies (to_tf32_pairs); both need d % 4 == 0 and
// 16-byte aligned rows (the dispatcher falls back to the FMA kernels otherwise), and the split
// kernel d ≤ 64 (its pair rows at width 128 outgrow shared memory).
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/attention/full_attention_flash.h"
#include "cuda/launch.cuh"
#include "cuda/tensor_core.cuh"
#include "math/softmax_rule.h"

namespace cast::cuda {

namespace {

constexpr int kWarps = 4, kBlock = 32 * kWarps, kRowsPerWarp = 16;

__device__ __forceinline__ int min_of(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ bool is_infinite(float x) { return (__float_as_uint(x) & 0x7fffffffu) == 0x7f800000u; }

__device__ __forceinline__ float bits_as_float(uint32_t u) {
#if defined(CAST_CUDA_EMULATION)
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#else
  return __uint_as_float(u);
#endif
}

// ---------------------------------------------------------------- the three kinds of product
// Operands sit in shared memory as 16-byte chunks (8 BF16 or 4 FP32 elements); one mma k-step is
// two chunks. A fragments of a row-major tile and B fragments of a tile whose rows are B's
// columns (B[k][n] = T[n][k]) come by ldmatrix and are the same registers in both formats
// (tensor_core.cuh). What differs: how raw registers become operands, the product, how
// accumulators become an A operand, and B[k][n] = T[k][n] (a "transposed" load).
struct Bf16Math {
  using Elem = uint16_t;
  static constexpr int kChunk = 8, kK = 16;
  static constexpr int kPlanes = 1;  // a row of an operand: its d elements
  struct A {
    uint32_t r[4];
  };
  struct B {
    uint32_t r[2];
  };
  __device__ static A a_raw(const uint32_t (&r)[4]) { return {{r[0], r[1], r[2], r[3]}}; }
  __device__ static B b_raw(uint32_t r0, uint32_t r1) { return {{r0, r1}}; }
  __device__ static void mma(float (&d)[4], const A& a, const B& b) { tc::mma_bf16(d, a.r, b.r); }
  __device__ static void mma_long(float (&d)[4], const A& a, const B& b) { mma(d, a, b); }
  __device__ static float exp2(float x) { return tc::ex2_approx(x); }
  __device__ static Elem elem(float x) { return tc::to_bf16(x); }  // an operand as shared memory keeps it
  // Where column k of an A operand goes in shared memory, so that load_a's fragments meet
  // b_trans's rows: BF16 keeps the order.
  __device__ static int a_column(int k) { return k; }
  // The A operand of k-step kk (columns 16kk .. 16kk + 15) from two 16×8 accumulator tiles:
  // C's (g, 2t..2t+1) pairs are exactly A's, packed.
  template <bool Finite, int NT>
  __device__ static A a_from_c(const float (&c)[NT][4], int kk) {
    const float* lo = c[2 * kk];
    const float* hi = c[2 * kk + 1];
    return {{tc::pack_bf16(lo[0], lo[1]), tc::pack_bf16(lo[2], lo[3]), tc::pack_bf16(hi[0], hi[1]),
             tc::pack_bf16(hi[2], hi[3])}};
  }
  // B[k][n] = T[k0 + k][n0 + n] for two n-tiles (n0 and n0 + 8), T row-major: ldmatrix .trans.
  template <int D>
  __device__ static void b_trans(B (&b)[2], const SharedArray<Elem>& s, int base, int stride, int k0, int n0,
                                 int lane) {
    uint32_t r[4];
    tc::ldmatrix_x4_trans(r, s, base + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * stride + n0 + 8 * (lane / 16));
    b[0] = {{r[0], r[1]}}, b[1] = {{r[2], r[3]}};
  }
};

// x as a TF32 high part and a TF32 remainder, hi + lo = x to about 2^-22 relative. An infinity is
// its high part alone (inf − inf would be NaN); a finite x whose rounding overflows to infinity
// keeps its truncated high part, so that the remainder stays finite; NaN stays NaN in both.
__device__ __forceinline__ void split_tf32(uint32_t& hi, uint32_t& lo, float x) {
  hi = tc::to_tf32(x);
  if (is_infinite(bits_as_float(hi)) && !is_infinite(x)) hi = __float_as_uint(x) & 0xffffe000u;
  lo = is_infinite(x) ? 0u : tc::to_tf32(x - bits_as_float(hi));
}

// TF32 accumulators become an A operand through a permutation of k: register a0 of lane (g, t)
// takes C's column 2t and a2 its column 2t + 1, so A's k = t is the tile's column 2t and k = t + 4
// its column 2t + 1. The product is the same sum over k when B's rows are permuted alike:
// b0 = T[k0 + 2t][n], b1 = T[k0 + 2t + 1][n] (two scalar reads; ldmatrix moves 16-bit elements).
template <bool Split>
struct Tf32MathT {
  using Elem = float;
  static constexpr int kChunk = 4, kK = 8;
  static constexpr int kParts = Split ? 2 : 1;  // high part, then the remainder
  // A row of an operand in shared memory (and in the split kernel's copies): its d elements, or
  // the d high parts and then the d remainders (pair rows, already split).
  static constexpr int kPlanes = kParts;
  struct A {
    uint32_t r[kParts][4];
  };
  struct B {
    uint32_t r[kParts][2];
  };
  __device__ static void split(uint32_t (&parts)[kParts], float x) {
    if constexpr (Split) split_tf32(parts[0], parts[1], x);
    else parts[0] = tc::to_tf32(x);
  }
  __device__ static A a_of(float x0, float x1, float x2, float x3) {
    A a;
    const float x[4] = {x0, x1, x2, x3};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t parts[kParts];
      split(parts, x[i]);
#pragma unroll
      for (int p = 0; p < kParts; ++p) a.r[p][i] = parts[p];
    }
    return a;
  }
  __device__ static B b_of(float x0, float x1) {
    B b;
    uint32_t p0[kParts], p1[kParts];
    split(p0, x0), split(p1, x1);
#pragma unroll
    for (int p = 0; p < kParts; ++p) b.r[p][0] = p0[p], b.r[p][1] = p1[p];
    return b;
  }
  // Raw FP32 registers as operands (rounded, or split).
  __device__ static A a_raw(const uint32_t (&r)[4]) {
    return a_of(bits_as_float(r[0]), bits_as_float(r[1]), bits_as_float(r[2]), bits_as_float(r[3]));
  }
  __device__ static B b_raw(uint32_t r0, uint32_t r1) { return b_of(bits_as_float(r0), bits_as_float(r1)); }
  // Operands from pair rows: the parts as they were split, with nothing to convert.
  __device__ static A a_parts(const uint32_t (&hi)[4], const uint32_t (&lo)[4]) {
    return {{{hi[0], hi[1], hi[2], hi[3]}, {lo[0], lo[1], lo[2], lo[3]}}};
  }
  __device__ static B b_parts(uint32_t hi0, uint32_t hi1, uint32_t lo0, uint32_t lo1) {
    return {{{hi0, hi1}, {lo0, lo1}}};
  }
  __device__ static void mma(float (&d)[4], const A& a, const B& b) {
    if constexpr (Split) {  // the small terms first
      tc::mma_tf32(d, a.r[1], b.r[0]);
      tc::mma_tf32(d, a.r[0], b.r[1]);
    }
    tc::mma_tf32(d, a.r[0], b.r[0]);
  }
  // A k-step of a running sum (every product of the split kernel: the scores and dP over the head
  // width too, P V over every key, dQ, dK, dV). The tensor core adds its accumulator input with
  // the low bits cut off, so a sum carried through it loses up to an ulp at every k-step, always
  // towards zero: over 1024 keys that measured ten times the error of FP32 FMAs. The split kernel
  // sums each k-step's three products from zero and adds them to d with an FP32 add, rounded to
  // nearest. With the scores' sums carried (8 k-steps at width 64), the emulation measured 1.6
  // times the FMA kernel's error at width 64; summed apart, half of it at widths 32 and 64
  // (bench/RESULTS.md). The other kernels, whose operands' rounding dwarfs the cut, carry the sum.
  __device__ static void mma_long(float (&d)[4], const A& a, const B& b) {
    if constexpr (Split) {
      float part[4] = {0.f, 0.f, 0.f, 0.f};
      mma(part, a, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] += part[i];
    } else {
      mma(d, a, b);
    }
  }
  // The one-instruction 2^x (relative error about 2^-22, a few FP32 ulps; exp2f's is 2 ulps but
  // several instructions per score, in the split kernel a large share of its issue slots beside
  // the products). The errors of P's elements are independent and average out in P·V; the
  // kernel's error against f64 is measured beside the FMA kernel's (`cast bench flash
  // --check-length`, bench/RESULTS.md).
  __device__ static float exp2(float x) { return tc::ex2_approx(x); }
  __device__ static Elem elem(float x) { return x; }  // split or rounded where it is loaded
  // b_trans pairs B's rows 2t and 2t + 1 with A's k = t and t + 4 (the permutation above), so an
  // A operand stored for load_a holds column 2t of each 8 at t and column 2t + 1 at t + 4.
  __device__ static int a_column(int k) { return k / 8 * 8 + k % 2 * 4 + k % 8 / 2; }
  // Finite: the weights are never infinite (P, at most 1, or NaN), so the split needs none of
  // split_tf32's care for infinities: two conversions and a subtraction.
  template <bool Finite, int NT>
  __device__ static A a_from_c(const float (&c)[NT][4], int kk) {
    if constexpr (Split && Finite) {
      A a;
      const float x[4] = {c[kk][0], c[kk][2], c[kk][1], c[kk][3]};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a.r[0][i] = tc::to_tf32(x[i]);
        a.r[1][i] = tc::to_tf32(x[i] - bits_as_float(a.r[0][i]));
      }
      return a;
    } else {
      return a_of(c[kk][0], c[kk][2], c[kk][1], c[kk][3]);
    }
  }
  // (pair rows: each part from its plane, D elements apart)
  template <int D>
  __device__ static void b_trans(B (&b)[2], const SharedArray<Elem>& s, int base, int stride, int k0, int n0,
                                 int lane) {
    const int g = lane / 4, t = lane % 4;
    const int row = base + (k0 + 2 * t) * stride + n0 + g;
    if constexpr (Split) {
      const auto bits = [&](int at) { return __float_as_uint(s[at]); };
      b[0] = b_parts(bits(row), bits(row + stride), bits(row + D), bits(row + stride + D));
      b[1] = b_parts(bits(row + 8), bits(row + stride + 8), bits(row + D + 8), bits(row + stride + D + 8));
    } else {
      b[0] = b_of(s[row], s[row + stride]);
      b[1] = b_of(s[row + 8], s[row + stride + 8]);
    }
  }
};
using Tf32Math = Tf32MathT<false>;
using Tf32x3Math = Tf32MathT<true>;

// The row this lane gives ldmatrix for the A fragment of rows row0 .. row0 + 15, columns
// k0 .. k0 + kK − 1 of a row-major tile.
template <class M>
__device__ __forceinline__ int a_fragment_row(int base, int stride, int row0, int k0, int lane) {
  return base + (row0 + lane % 8 + 8 * (lane / 8 % 2)) * stride + k0 + M::kChunk * (lane / 16);
}

// That A fragment from a tile of operand rows (pair rows in the split kernel: each part by its
// own ldmatrix, D elements apart).
template <class M, int D>
__device__ __forceinline__ typename M::A load_a(const SharedArray<typename M::Elem>& s, int base, int stride, int row0,
                                                int k0, int lane) {
  const int at = a_fragment_row<M>(base, stride, row0, k0, lane);
  uint32_t r[4];
  tc::ldmatrix_x4(r, s, at);
  if constexpr (M::kPlanes == 2) {
    uint32_t lo[4];
    tc::ldmatrix_x4(lo, s, at + D);
    return M::a_parts(r, lo);
  } else {
    return M::a_raw(r);
  }
}

// The same from a tile of raw values (the fused backward's dS): rounded, or split, as loaded.
template <class M>
__device__ __forceinline__ typename M::A load_a_raw(const SharedArray<typename M::Elem>& s, int base, int stride,
                                                    int row0, int k0, int lane) {
  uint32_t r[4];
  tc::ldmatrix_x4(r, s, a_fragment_row<M>(base, stride, row0, k0, lane));
  return M::a_raw(r);
}

// The B fragments of two n-tiles, B[k][n] = T[n0 + n][k0 + k] (T's rows are B's columns: keys in
// S = Q Kᵀ).
template <class M, int D>
__device__ __forceinline__ void load_b_rows(typename M::B (&b)[2], const SharedArray<typename M::Elem>& s, int base,
                                            int stride, int n0, int k0, int lane) {
  const int at = base + (n0 + 8 * (lane / 16) + lane % 8) * stride + k0 + M::kChunk * (lane / 8 % 2);
  uint32_t r[4];
  tc::ldmatrix_x4(r, s, at);
  if constexpr (M::kPlanes == 2) {
    uint32_t lo[4];
    tc::ldmatrix_x4(lo, s, at + D);
    b[0] = M::b_parts(r[0], r[1], lo[0], lo[1]);
    b[1] = M::b_parts(r[2], r[3], lo[2], lo[3]);
  } else {
    b[0] = M::b_raw(r[0], r[1]);
    b[1] = M::b_raw(r[2], r[3]);
  }
}

// acc[mi][nt] = X(rows row0 + 16mi .., all columns) · Y(rows 8nt ..)ᵀ: a warp's 16MI × 8NT block
// of scores, S = X Yᵀ with X and Y both row-major in shared memory. Each B fragment (Y's rows)
// feeds MI products. Columns past `width` (the head width rounded up to the k-step) are zeros
// and skipped. Each k-step by M::mma_long (the split kernel sums it apart).
template <class M, int D, int MI, int NT>
__device__ __forceinline__ void product_xyt(float (&acc)[MI][NT][4], const SharedArray<typename M::Elem>& s, int x_base,
                                            int y_base, int stride, int row0, int width, int lane) {
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mi][nt][0] = acc[mi][nt][1] = acc[mi][nt][2] = acc[mi][nt][3] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += M::kK) {
    if (k0 >= width) break;
    typename M::A a[MI];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) a[mi] = load_a<M, D>(s, x_base, stride, row0 + 16 * mi, k0, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      typename M::B b[2];
      load_b_rows<M, D>(b, s, y_base, stride, 16 * np, k0, lane);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        M::mma_long(acc[mi][2 * np], a[mi], b[0]);
        M::mma_long(acc[mi][2 * np + 1], a[mi], b[1]);
      }
    }
  }
}

// out[mi][dt] += W · Z: W the warp's 16MI × 8NT weights in accumulator layout (P or dS; Finite:
// never infinite, as P), Z a row-major tile of 8NT rows and D columns in shared memory; columns
// past `width` are skipped. `out` is a long running sum (M::mma_long).
template <class M, int D, int MI, int NT, bool Finite>
__device__ __forceinline__ void product_wz(float (&out)[MI][D / 8][4], const float (&w)[MI][NT][4],
                                           const SharedArray<typename M::Elem>& s, int z_base, int stride, int width,
                                           int lane) {
  constexpr int steps = 8 * NT / M::kK;
#pragma unroll
  for (int kk = 0; kk < steps; ++kk) {
    typename M::A a[MI];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) a[mi] = M::template a_from_c<Finite>(w[mi], kk);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      if (16 * dp >= width) break;
      typename M::B b[2];
      M::template b_trans<D>(b, s, z_base, stride, kk * M::kK, 16 * dp, lane);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        M::mma_long(out[mi][2 * dp], a[mi], b[0]);
        M::mma_long(out[mi][2 * dp + 1], a[mi], b[1]);
      }
    }
  }
}

// ---------------------------------------------------------------- tiles and copies
// The shape of one call: operands are rows of `row` elements, a plane of `width` elements (d,
// or d rounded up to 8 for the BF16 copies, of which the first d are real) or the split kernel's
// two planes.
struct TcShape {
  int heads, M, N, d, width, row;
  float scale;
};

// A block's tiles: it owns 64·MI rows (16·MI per warp) and streams tiles of BS rows, in Stages
// buffers: two, the copy of tile j + 1 running while tile j is multiplied, or one, the copy
// waited for before each tile (the streamed tiles' shared memory halved).
template <class M, int D_, int BS, int MI_ = 1, int Stages = 2>
struct TcTile {
  static constexpr int D = D_, MI = MI_, kStages = Stages;
  static constexpr int kStream = BS;                   // rows of each streamed tile
  static constexpr int kWarpRows = kRowsPerWarp * MI;  // rows of the owned tile per warp
  static constexpr int kOwnedRows = kWarps * kWarpRows;
  // a row's planes and a 16-byte pad: ldmatrix's 8 rows hit distinct banks
  static constexpr int kStride = M::kPlanes * D + M::kChunk;
  static constexpr int kOwned = kOwnedRows * kStride, kStreamed = kStream * kStride;
  // the fused backward's dS: a streamed tile's rows (queries) of the block's keys, padded as the tiles
  static constexpr int kDsStride = kOwnedRows + M::kChunk, kDs = kStream * kDsStride;
  // elements of shared memory: the owned tile(s), the stages of the two streamed tiles, and dS
  static constexpr int elements(int owned_tiles, bool with_ds = false) {
    return owned_tiles * kOwned + 2 * kStages * kStreamed + (with_ds ? kDs : 0);
  }
};

// TcTile::elements in bytes, for a kernel and tile chosen at run time (the dispatch's limits,
// the benchmarks' labels, the launch report); static_asserts at each launch hold the two equal.
constexpr size_t tile_shared_bytes(FlashKernel kernel, int D, int rows, int warp_tiles, int owned_tiles,
                                   bool with_ds = false, int stages = 2) {
  const size_t elem = kernel == FlashKernel::bf16 ? 2 : 4, chunk = 16 / elem,
               stride = (kernel == FlashKernel::tf32x3 ? 2 : 1) * D + chunk;
  const size_t owned_rows = static_cast<size_t>(kWarps) * kRowsPerWarp * warp_tiles;
  return ((owned_tiles * owned_rows + 2 * static_cast<size_t>(stages) * rows) * stride +
          (with_ds ? rows * (owned_rows + chunk) : 0)) * elem;
}

// cp.async of `valid` rows of an operand (rows of M::kPlanes planes of `width` elements) from src
// into a tile of `rows` padded rows at `base`, each plane D elements wide; zeros past `valid` rows
// and past each plane's width.
template <class M, int D>
__device__ __forceinline__ void copy_rows(const SharedArray<typename M::Elem>& s, int base, int stride,
                                          const typename M::Elem* src, int valid, int rows, int width) {
  constexpr int plane_chunks = D / M::kChunk, chunks = M::kPlanes * plane_chunks, row = M::kPlanes * D;
  static_assert(kBlock % chunks == 0, "a thread copies the same chunk of every (kBlock / chunks)-th row");
  if (valid == rows && width == D && rows * chunks % kBlock == 0) {
    // A whole tile (nearly every one): no bounds, and each thread's offsets are fixed but for
    // the row step, which unrolls into the instructions' immediates.
    const int r0 = threadIdx.x / chunks, c = threadIdx.x % chunks * M::kChunk;
    const typename M::Elem* from = src + static_cast<int64_t>(r0) * row + c;
    const int to = base + r0 * stride + c;
#pragma unroll 4
    for (int i = 0; i < rows * chunks / kBlock; ++i)
      tc::cp_async16(s, to + i * (kBlock / chunks) * stride, from + static_cast<int64_t>(i) * (kBlock / chunks) * row,
                     true);
    return;
  }
  for (int f = threadIdx.x; f < rows * chunks; f += blockDim.x) {
    const int r = f / chunks, plane = f % chunks / plane_chunks, c = f % plane_chunks * M::kChunk;
    const bool real = r < valid && c < width;
    tc::cp_async16(s, base + r * stride + plane * D + c,
                   real ? src + static_cast<int64_t>(r) * M::kPlanes * width + plane * width + c : src, real);
  }
}

__device__ __forceinline__ bool key_is_real(const float* mask, int b, int j, int N) {
  return j < N && (!mask || mask[static_cast<int64_t>(b) * N + j] != 0.f);
}

// The keys of a streamed tile of 8NT columns at j0: bit c of columns[c / 32] says whether column
// c is real, and `all` whether every column is, the same in the whole warp, so that tiles
// without padding (nearly all) skip the masking. Each lane reads the mask of one column in 32
// (a ballot each), not of its 2NT columns.
template <int NT>
struct KeyBits {
  uint32_t columns[NT / 4];
  bool all;
  // whether this thread's column 8nt + 2t + e is real
  __device__ bool real(int nt, int t, int e) const { return (columns[nt / 4] >> (8 * (nt % 4) + 2 * t + e)) & 1u; }
};
template <int NT>
__device__ __forceinline__ KeyBits<NT> key_bits(const float* mask, int b, int j0, int N, int lane) {
  static_assert(NT % 4 == 0 && NT <= 16, "a tile of 32, 64 or 128 keys");
  KeyBits<NT> keys;
  keys.all = true;
#pragma unroll
  for (int w = 0; w < NT / 4; ++w) {
    keys.columns[w] = __ballot_sync(0xffffffffu, key_is_real(mask, b, j0 + 32 * w + lane, N));
    keys.all = keys.all && keys.columns[w] == 0xffffffffu;
  }
  return keys;
}

// Scores enter the exponentials in base 2: exp(scale·s − m) = 2^(c·s − m·log2 e), c = scale·log2 e,
// one FFMA and one exp2 per score.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// Where streamed tile `tile` sits: its stage's first operand at base + 2·(tile % kStages)·kStreamed,
// the second after it.
template <class T>
__device__ __forceinline__ int stage_of(int base, int tile) {
  return base + 2 * (tile % T::kStages) * T::kStreamed;
}

// cp.async of streamed tile `tile` of two operands x and y (`rows` rows of TcShape::row elements
// each) into its stage (stage_of).
template <class M, class T>
__device__ __forceinline__ void copy_stage(const SharedArray<typename M::Elem>& s, int base, const typename M::Elem* x,
                                           const typename M::Elem* y, int tile, int rows, const TcShape& shape) {
  const int r0 = tile * T::kStream, valid = min_of(rows - r0, T::kStream);
  const int st = stage_of<T>(base, tile);
  const int64_t at = static_cast<int64_t>(r0) * shape.row;
  copy_rows<M, T::D>(s, st, T::kStride, x + at, valid, T::kStream, shape.width);
  copy_rows<M, T::D>(s, st + T::kStreamed, T::kStride, y + at, valid, T::kStream, shape.width);
}

// The copy of the next streamed tile at the top of the loop over tiles (tile 0 was copied before
// it): with two stages tile + 1, into the stage tile − 1 left; with one, tile itself, into the
// stage the last iteration's closing barrier freed. Then wait_stage: tile's copy complete and seen.
template <class T, class Copy>
__device__ __forceinline__ void copy_next_stage(int tile, int tiles, const Copy& copy) {
  if constexpr (T::kStages == 2) {
    if (tile + 1 < tiles) copy(tile + 1);
  } else if (tile > 0) {
    copy(tile);
  }
  tc::cp_async_commit();
}
template <class T>
__device__ __forceinline__ void wait_stage() {
  tc::cp_async_wait<T::kStages - 1>();
  __syncthreads();
}

// Row max and sum over the four lanes (t = 0..3) that share a row of an accumulator.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// dst[row][col] (+)= acc for the warp's rows row0 + g and row0 + g + 8 (global rows < rows_total,
// columns < d), each row scaled by scale[r].
template <int D>
__device__ __forceinline__ void store_acc(float* dst, const float (&acc)[D / 8][4], int row0, int rows_total,
                                          const float (&scale)[2], bool add, int d, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + g + 8 * (i / 2), col = 8 * dt + 2 * t + i % 2;
      if (row >= rows_total || col >= d) continue;
      float& out = dst[static_cast<int64_t>(row) * d + col];
      const float v = acc[dt][i] * scale[i / 2];
      out = add ? out + v : v;
    }
}

// ---------------------------------------------------------------- forward
// One streamed tile into the online softmax of a warp's 16 rows (two per thread): scores of
// padding keys become −∞, the running max m (in base-2 units: c·s) and sum l take the tile in
// (the output rescaled where m grows), and the raw scores s become the tile's weights
// 2^(c·s − m) for P V. The rules of math/softmax_rule.h, in base 2: a masked score weighs 2^−∞ = 0
// (a row with no real score yet shifts by 0, not by −∞, which would give −∞ + ∞ = NaN), and a
// NaN score, which fmaxf passes over, makes its weight and so the row's sum NaN.
template <class M, int NT, int D>
__device__ __forceinline__ void online_softmax(float (&sc)[NT][4], float (&m)[2], float (&l)[2], float (&o)[D / 8][4],
                                               const KeyBits<NT>& keys, float c, int t) {
  const float masked = softmax_rule::masked<float>();
  if (!keys.all)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (!keys.real(nt, t, i % 2)) sc[nt][i] = masked;
  float tile_max[2] = {masked, masked};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) tile_max[i / 2] = fmaxf(tile_max[i / 2], sc[nt][i]);
  float correction[2], shift[2], sum[2] = {0.f, 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_new = fmaxf(m[r], quad_max(tile_max[r]) * c);
    correction[r] = m_new == masked ? 1.f : M::exp2(m[r] - m_new);
    shift[r] = m_new == masked ? 0.f : m_new;
    m[r] = m_new;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sc[nt][i] = M::exp2(fmaf(sc[nt][i], c, -shift[i / 2]));
      sum[i / 2] += sc[nt][i];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * correction[r] + quad_sum(sum[r]);
  // once the rows' maxima settle, no row of the warp grows: the output keeps its scale
  if (!__all_sync(0xffffffffu, correction[0] == 1.f && correction[1] == 1.f))
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[dt][i] *= correction[i / 2];
}

template <class M, class T>
__global__ void __launch_bounds__(kBlock)
    flash_tc_forward_kernel(float* out, float* lse, const typename M::Elem* q, const typename M::Elem* k,
                            const typename M::Elem* v, const float* mask, TcShape s) {
  using E = typename M::Elem;
  constexpr int D = T::D, BN = T::kStream, NT = BN / 8, MI = T::MI, stride = T::kStride, BM = T::kOwnedRows;
  constexpr int q_base = 0, kv_base = T::kOwned;  // stage st: K at kv_base + 2st·kStreamed, V after it
  CAST_DYNAMIC_SHARED(E, smem, T::elements(1));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4, row0 = T::kWarpRows * warp;
  const int bh = blockIdx.y, b = bh / s.heads, i0 = blockIdx.x * BM;
  const int q_rows = min_of(s.M - i0, BM);
  const bool live = row0 < q_rows;
  const int64_t k_off = static_cast<int64_t>(bh) * s.N * s.row;
  const int tiles = (s.N + BN - 1) / BN, width = (s.width + M::kK - 1) / M::kK * M::kK;
  const float c = s.scale * kLog2e;

  copy_rows<M, D>(smem, q_base, stride, q + (static_cast<int64_t>(bh) * s.M + i0) * s.row, q_rows, BM, s.width);
  const auto copy_keys = [&](int tile) { copy_stage<M, T>(smem, kv_base, k + k_off, v + k_off, tile, s.N, s); };
  copy_keys(0);
  tc::cp_async_commit();

  float o[MI][D / 8][4], m[MI][2], l[MI][2];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.f;
    m[mi][0] = m[mi][1] = softmax_rule::masked<float>(), l[mi][0] = l[mi][1] = 0.f;
  }

  for (int tile = 0; tile < tiles; ++tile) {
    copy_next_stage<T>(tile, tiles, copy_keys);
    const int j0 = tile * BN, st = stage_of<T>(kv_base, tile);
    const KeyBits<NT> keys = key_bits<NT>(mask, b, j0, s.N, lane);
    wait_stage<T>();
    if (live) {
      float sc[MI][NT][4];
      product_xyt<M, D, MI, NT>(sc, smem, q_base, st, stride, row0, width, lane);
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) online_softmax<M, NT, D>(sc[mi], m[mi], l[mi], o[mi], keys, c, t);
      product_wz<M, D, MI, NT, true>(o, sc, smem, st + T::kStreamed, stride, s.d, lane);
    }
    __syncthreads();  // this stage is read no more: the next iteration's copy may fill it
  }
  const int64_t row_base = static_cast<int64_t>(bh) * s.M;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    const float inv[2] = {softmax_rule::inverse_sum(l[mi][0]), softmax_rule::inverse_sum(l[mi][1])};
    const int rows0 = i0 + row0 + 16 * mi;
    if (t == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rows0 + g + 8 * r;
        if (row < s.M) lse[row_base + row] = softmax_rule::log_sum_exp(m[mi][r] * kLn2, l[mi][r]);
      }
    store_acc<D>(out + row_base * s.d, o[mi], rows0, s.M, inv, false, s.d, lane);
  }
}

// ---------------------------------------------------------------- dQ
// Owned: Q and dO (16·MI query rows per warp); streamed: K and V. With MI = 2 each fragment of K
// and V read from shared memory feeds two products instead of one.
template <class M, class T>
__global__ void __launch_bounds__(kBlock)
    flash_tc_dq_kernel(float* dq, const typename M::Elem* dout, const typename M::Elem* q, const typename M::Elem* k,
                       const typename M::Elem* v, const float* mask, const float* lse, const float* delta, TcShape s) {
  using E = typename M::Elem;
  constexpr int D = T::D, BN = T::kStream, NT = BN / 8, MI = T::MI, stride = T::kStride, BM = T::kOwnedRows;
  constexpr int q_base = 0, g_base = T::kOwned, kv_base = 2 * T::kOwned;
  CAST_DYNAMIC_SHARED(E, smem, T::elements(2));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4, row0 = T::kWarpRows * warp;
  const int bh = blockIdx.y, b = bh / s.heads, i0 = blockIdx.x * BM;
  const int q_rows = min_of(s.M - i0, BM);
  const bool live = row0 < q_rows;
  const int64_t k_off = static_cast<int64_t>(bh) * s.N * s.row,
                q_off = (static_cast<int64_t>(bh) * s.M + i0) * s.row;
  const int tiles = (s.N + BN - 1) / BN, width = (s.width + M::kK - 1) / M::kK * M::kK;

  copy_rows<M, D>(smem, q_base, stride, q + q_off, q_rows, BM, s.width);
  copy_rows<M, D>(smem, g_base, stride, dout + q_off, q_rows, BM, s.width);
  const auto copy_keys = [&](int tile) { copy_stage<M, T>(smem, kv_base, k + k_off, v + k_off, tile, s.N, s); };
  copy_keys(0);
  tc::cp_async_commit();

  // L2: each row's log-sum-exp in base 2, −∞ for a row with no real key (and past the last)
  const float c = s.scale * kLog2e;
  float L2[MI][2], Dl[MI][2], acc[MI][D / 8][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = i0 + row0 + 16 * mi + g + 8 * r;
      L2[mi][r] = row < s.M ? lse[static_cast<int64_t>(bh) * s.M + row] * kLog2e : softmax_rule::masked<float>();
      Dl[mi][r] = row < s.M ? delta[static_cast<int64_t>(bh) * s.M + row] : 0.f;
    }
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) acc[mi][dt][0] = acc[mi][dt][1] = acc[mi][dt][2] = acc[mi][dt][3] = 0.f;
  }

  for (int tile = 0; tile < tiles; ++tile) {
    copy_next_stage<T>(tile, tiles, copy_keys);
    const int j0 = tile * BN, st = stage_of<T>(kv_base, tile);
    const KeyBits<NT> keys = key_bits<NT>(mask, b, j0, s.N, lane);
    wait_stage<T>();
    if (live) {
      float sc[MI][NT][4], dp[MI][NT][4];
      product_xyt<M, D, MI, NT>(sc, smem, q_base, st, stride, row0, width, lane);
      product_xyt<M, D, MI, NT>(dp, smem, g_base, st + T::kStreamed, stride, row0, width, lane);
      // dS = P ⊙ (dP − Δ), P = 2^(c·s − L2). Where every key of the tile is real, so is every row's
      // L2 (a row past the last holds garbage that is never stored); elsewhere dS is 0 at padding
      // keys and in rows with no real key.
      if (keys.all) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float p = M::exp2(fmaf(sc[mi][nt][i], c, -L2[mi][i / 2]));
              sc[mi][nt][i] = softmax_rule::score_gradient(p, dp[mi][nt][i], Dl[mi][i / 2]) * s.scale;
            }
      } else {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int r = i / 2;
              const bool is_real = keys.real(nt, t, i % 2) && L2[mi][r] != softmax_rule::masked<float>();
              const float p = is_real ? M::exp2(fmaf(sc[mi][nt][i], c, -L2[mi][r])) : 0.f;
              sc[mi][nt][i] = is_real ? softmax_rule::score_gradient(p, dp[mi][nt][i], Dl[mi][r]) * s.scale : 0.f;
            }
      }
      product_wz<M, D, MI, NT, false>(acc, sc, smem, st, stride, s.d, lane);
    }
    __syncthreads();
  }
  const float one[2] = {1.f, 1.f};
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
    store_acc<D>(dq + static_cast<int64_t>(bh) * s.M * s.d, acc[mi], i0 + row0 + 16 * mi, s.M, one, true, s.d, lane);
}

// The fused backward's dQ for query tile `tile`: once the block's dS is whole in shared memory,
// each warp's pieces of dS·K over the block's keys, added to dq when the block's turn comes (the
// caller passes the turn on after its barrier; every thread's stores are fenced before that), or
// with Atomic at once by atomic adds, in whatever order the blocks reach them.
template <class M, class T, int kPerWarp, bool Atomic>
__device__ __forceinline__ void add_dq_tile(float* dq, int* turns, const SharedArray<typename M::Elem>& smem,
                                            int ds_base, int ds_stride, int k_base, int tile, int width,
                                            const TcShape& s) {
  constexpr int D = T::D, BQ = T::kStream, BK = T::kOwnedRows;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int dq_row0 = 16 * (kPerWarp * warp / (D / 16)), dq_col0 = 16 * (kPerWarp * warp % (D / 16));
  const int bh = blockIdx.y, i0 = tile * BQ, tiles = (s.M + BQ - 1) / BQ;
  __syncthreads();  // dS whole
  float part[kPerWarp][2][4];
#pragma unroll
  for (int p = 0; p < kPerWarp; ++p)
#pragma unroll
    for (int i = 0; i < 8; ++i) part[p][i / 4][i % 4] = 0.f;
#pragma unroll
  for (int k0 = 0; k0 < BK; k0 += M::kK) {
    const typename M::A a = load_a_raw<M>(smem, ds_base, ds_stride, dq_row0, k0, lane);
#pragma unroll
    for (int p = 0; p < kPerWarp; ++p) {
      if (dq_col0 + 16 * p >= width) break;
      typename M::B bk[2];
      M::template b_trans<D>(bk, smem, k_base, T::kStride, k0, dq_col0 + 16 * p, lane);
      M::mma_long(part[p][0], a, bk[0]);
      M::mma_long(part[p][1], a, bk[1]);
    }
  }
  if constexpr (!Atomic) {
    if (threadIdx.x == 0) wait_turn(turns + static_cast<int64_t>(bh) * tiles + tile, static_cast<int>(blockIdx.x));
    __syncthreads();
  }
  float* dq_tile = dq + (static_cast<int64_t>(bh) * s.M + i0 + dq_row0) * s.d;
#pragma unroll
  for (int p = 0; p < kPerWarp; ++p)
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // piece p's n-tile i / 4, its accumulator element i % 4
      const int row = g + 8 * (i % 4 / 2), col = dq_col0 + 16 * p + 8 * (i / 4) + 2 * t + i % 2;
      if (i0 + dq_row0 + row < s.M && col < s.d) {
        float* at = dq_tile + static_cast<int64_t>(row) * s.d + col;
        if constexpr (Atomic) atomicAdd(at, part[p][i / 4][i % 4]);
        else store_coherent(at, load_coherent(at) + part[p][i / 4][i % 4]);
      }
    }
  if constexpr (!Atomic) __threadfence();  // this block's sums are seen by the GPU before its turn passes on
}

// ---------------------------------------------------------------- dK, dV (and dQ)
// What the dK/dV kernel does with dQ: nothing (the split pair's dQ kernel forms it), add its
// partials in turn (the same sums at every run), or add them by atomic adds.
enum class DqAdd : int { none, in_turn, atomic };

// Owned: K and V (16·MI key rows per warp); streamed: Q and dO. Scores are formed transposed
// (keys × queries) so that Pᵀ and dSᵀ are already the A operands of dV += Pᵀ dO and dK += dSᵀ Q.
//
// With AddDq, the backward in one kernel, as FlashAttention-2's: the scores and dP are formed
// once instead of also in the dQ kernel (5 tile products instead of the pair's 7). Each block
// writes its tile's dSᵀ to shared memory as dS (queries × its keys), the four warps form dQ's
// partial over the block's keys, dS·K, in 16×16 pieces, and the partials of a query tile go into
// dq in turn, block x after block x − 1 of the same batch-head (a flag per query tile counts the
// turns), so the sum is the same at every run, with no atomics' order. On an H100 that measured
// 1.6 to 3.6 times slower than the pair at BF16 and TF32 (a wait, two barriers, an L2 round trip
// and a fence per query tile; bench/RESULTS.md): not the default. DqAdd::atomic adds the partials
// with atomic adds instead, as FlashAttention-2 does: no block waits, but the order of the sums,
// and so dq's last bits, may differ from run to run (`--flash-backward fused-atomic`, opt-in).
template <class M, class T, DqAdd kDq>
__global__ void __launch_bounds__(kBlock)
    flash_tc_dkdv_kernel(float* dk, float* dv, float* dq, int* turns, const typename M::Elem* dout,
                         const typename M::Elem* q, const typename M::Elem* k, const typename M::Elem* v,
                         const float* mask, const float* lse, const float* delta, TcShape s) {
  using E = typename M::Elem;
  constexpr bool AddDq = kDq != DqAdd::none;
  constexpr int D = T::D, BQ = T::kStream, NT = BQ / 8, MI = T::MI, stride = T::kStride, BK = T::kOwnedRows;
  constexpr int k_base = 0, v_base = T::kOwned, qg_base = 2 * T::kOwned,
                ds_base = qg_base + 2 * T::kStages * T::kStreamed;
  constexpr int ds_stride = T::kDsStride;  // dS: BQ rows (queries) of BK keys
  // dQ's pieces of 16 rows × 16 columns: the warps split them, each keeping one row band
  constexpr int kPieces = (BQ / 16) * (D / 16), kPerWarp = kPieces / kWarps;
  static_assert(kPieces % kWarps == 0 && kPerWarp <= D / 16, "a warp's pieces share their 16 query rows");
  CAST_DYNAMIC_SHARED(E, smem, T::elements(2, AddDq));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4, row0 = T::kWarpRows * warp;
  const int bh = blockIdx.y, b = bh / s.heads, j0 = blockIdx.x * BK;
  const int k_rows = min_of(s.N - j0, BK);
  const bool live = row0 < k_rows;
  const int64_t k_off = (static_cast<int64_t>(bh) * s.N + j0) * s.row,
                q_off = static_cast<int64_t>(bh) * s.M * s.row;
  const int tiles = (s.M + BQ - 1) / BQ, width = (s.width + M::kK - 1) / M::kK * M::kK;

  copy_rows<M, D>(smem, k_base, stride, k + k_off, k_rows, BK, s.width);
  copy_rows<M, D>(smem, v_base, stride, v + k_off, k_rows, BK, s.width);
  const auto copy_queries = [&](int tile) {
    copy_stage<M, T>(smem, qg_base, q + q_off, dout + q_off, tile, s.M, s);
  };
  copy_queries(0);
  tc::cp_async_commit();

  const float c = s.scale * kLog2e;
  bool real[MI][2], warp_real = true;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      real[mi][r] = key_is_real(mask, b, j0 + row0 + 16 * mi + g + 8 * r, s.N);
      warp_real = warp_real && real[mi][r];
    }
  // Every key of the warp real: then every query's row has one, and its L is finite (or NaN).
  const bool keys_all = __all_sync(0xffffffffu, warp_real);
  // the log-sum-exp and Δ of a query pair (2t, 2t + 1) lie 8-byte aligned (not read in pairs with
  // AddDq: the registers of the pair loads made the fused kernel spill at width 128)
  const bool pairs = !AddDq && s.M % 2 == 0 && reinterpret_cast<uintptr_t>(lse) % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(delta) % 8 == 0;
  float dk_acc[MI][D / 8][4], dv_acc[MI][D / 8][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dk_acc[mi][dt][i] = dv_acc[mi][dt][i] = 0.f;

  for (int tile = 0; tile < tiles; ++tile) {
    copy_next_stage<T>(tile, tiles, copy_queries);
    const int i0 = tile * BQ, st = stage_of<T>(qg_base, tile);
    float Li[NT][2], Di[NT][2];  // the log-sum-exp (base 2) and Δ of this thread's query columns
    const bool queries_all = i0 + BQ <= s.M;
    if (queries_all && pairs) {  // columns 2t and 2t + 1 side by side: one 8-byte load each
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int64_t at = static_cast<int64_t>(bh) * s.M + i0 + 8 * nt + 2 * t;
        tc::load_pair(Li[nt], lse + at);
        tc::load_pair(Di[nt], delta + at);
        Li[nt][0] *= kLog2e, Li[nt][1] *= kLog2e;
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = i0 + 8 * nt + 2 * t + e;
          const int64_t at = static_cast<int64_t>(bh) * s.M + i;
          Li[nt][e] = i < s.M ? lse[at] * kLog2e : softmax_rule::masked<float>();
          Di[nt][e] = i < s.M ? delta[at] : 0.f;
        }
    }
    const bool all_real = keys_all && queries_all;
    wait_stage<T>();
    if (live) {
      float st_[MI][NT][4], dpt[MI][NT][4];  // scores and dP, transposed: keys × queries
      product_xyt<M, D, MI, NT>(st_, smem, k_base, st, stride, row0, width, lane);
      product_xyt<M, D, MI, NT>(dpt, smem, v_base, st + T::kStreamed, stride, row0, width, lane);
      if (all_real) {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const float p = M::exp2(fmaf(st_[mi][nt][i], c, -Li[nt][i % 2]));
              dpt[mi][nt][i] = softmax_rule::score_gradient(p, dpt[mi][nt][i], Di[nt][i % 2]) * s.scale;
              st_[mi][nt][i] = p;
            }
      } else {
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              // A query with no real key (or past the last) passes nothing; a padding key takes P = 0
              // and dS = 0, which the products still multiply, so a NaN in Q or dO reaches it as in
              // the reference.
              const float L2 = Li[nt][i % 2];
              float p = 0.f, ds = 0.f;
              if (L2 != softmax_rule::masked<float>() && real[mi][i / 2]) {
                p = M::exp2(fmaf(st_[mi][nt][i], c, -L2));
                ds = softmax_rule::score_gradient(p, dpt[mi][nt][i], Di[nt][i % 2]) * s.scale;
              }
              st_[mi][nt][i] = p, dpt[mi][nt][i] = ds;
            }
      }
      if constexpr (AddDq)  // dSᵀ into shared memory as dS
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              smem[ds_base + (8 * nt + 2 * t + i % 2) * ds_stride + M::a_column(row0 + 16 * mi + g + 8 * (i / 2))] =
                  M::elem(dpt[mi][nt][i]);
      product_wz<M, D, MI, NT, true>(dv_acc, st_, smem, st + T::kStreamed, stride, s.d, lane);
      product_wz<M, D, MI, NT, false>(dk_acc, dpt, smem, st, stride, s.d, lane);
    } else if constexpr (AddDq) {  // keys past the last: their dS is 0
      for (int f = lane; f < BQ * T::kWarpRows; f += 32)
        smem[ds_base + f / T::kWarpRows * ds_stride + row0 + f % T::kWarpRows] = M::elem(0.f);
    }
    if constexpr (AddDq)
      add_dq_tile<M, T, kPerWarp, kDq == DqAdd::atomic>(dq, turns, smem, ds_base, ds_stride, k_base, tile, width, s);
    __syncthreads();  // this stage (and dS) is read no more: the next iteration's copy may fill it
    if constexpr (kDq == DqAdd::in_turn)
      if (threadIdx.x == 0) pass_turn(turns + static_cast<int64_t>(bh) * tiles + tile, static_cast<int>(blockIdx.x) + 1);
  }
  const float one[2] = {1.f, 1.f};
#pragma unroll
  for (int mi = 0; mi < MI; ++mi) {
    const int rows0 = j0 + row0 + 16 * mi;
    if (dk) store_acc<D>(dk + static_cast<int64_t>(bh) * s.N * s.d, dk_acc[mi], rows0, s.N, one, true, s.d, lane);
    if (dv) store_acc<D>(dv + static_cast<int64_t>(bh) * s.N * s.d, dv_acc[mi], rows0, s.N, one, true, s.d, lane);
  }
}

// ---------------------------------------------------------------- BF16 copies
// dst: rows × width BF16 (width = d rounded up to 8, zeros past d), from src: rows × d FP32.
__global__ void to_bf16_rows_kernel(uint16_t* dst, const float* src, int64_t rows, int d, int width) {
  CAST_KERNEL_LOOP(i, rows * width) {
    const int64_t r = i / width;
    const int c = static_cast<int>(i % width);
    dst[i] = c < d ? tc::to_bf16(src[r * d + c]) : uint16_t{0};
  }
}

// The same where rows need no padding (d % 8 == 0) and both ends are 16-byte aligned: eight
// elements a thread, two 16-byte loads and one 16-byte store (element by element, the copies
// of the Text step's operands ran at a third of the memory's bandwidth on an H100).
__global__ void to_bf16_flat_kernel(uint4* dst, const float4* src, int64_t eights) {
  CAST_KERNEL_LOOP(i, eights) {
    const float4 a = src[2 * i], b = src[2 * i + 1];
    dst[i] = make_uint4(tc::pack_bf16(a.x, a.y), tc::pack_bf16(a.z, a.w), tc::pack_bf16(b.x, b.y),
                        tc::pack_bf16(b.z, b.w));
  }
}

// ---------------------------------------------------------------- the split kernel's pair rows
// dst: rows × 2d, each row the d high parts of src's row and then its d remainders (split_tf32).
__global__ void to_tf32_pairs_kernel(float* dst, const float* src, int64_t rows, int d) {
  CAST_KERNEL_LOOP(i, rows * d) {
    const int64_t r = i / d;
    const int c = static_cast<int>(i % d);
    uint32_t hi, lo;
    split_tf32(hi, lo, src[i]);
    dst[2 * r * d + c] = bits_as_float(hi);
    dst[2 * r * d + d + c] = bits_as_float(lo);
  }
}

// ---------------------------------------------------------------- host side
// Tile shapes. A block owns 64 rows (128 at 32 rows per warp) and streams tiles of 32, 64 or 128
// rows (128 in the forward at widths up to 64 only: the backward's two score tiles of 128 columns
// would not fit the registers). The defaults are each kernel's fastest in
// `cast bench flash --stream-rows 32,64,128` on an H200 (bench/RESULTS.md, "Tensor cores");
// set_flash_stream_rows and set_flash_warp_rows override them for the benchmarks.
int g_stream_rows = 0;
int g_warp_rows = 0;  // rows per warp of the forward and the backward: 0 the defaults, 16 or 32
int g_copy_stages = 0;  // the split kernel's streamed buffers: 0 the defaults, 1 or 2
FlashBackward g_backward = FlashBackward::split;

// Each kernel's fastest tiles over N 1024, 4096 and 16384 (the least total time of the three):
// BF16 and TF32 from the H100 run bench/gpu_runs/2026-11-26-h100-tensor-core-5.md; the split
// TF32 kernel's (pair rows) the fastest at N 4096 alone, from the H200 run
// bench/gpu_runs/2026-11-28-h200-split-tf32.md.
// The backward's 32 rows per warp (and with them 32 streamed rows at width 64, where 64 would
// spill), where each fragment read from shared memory feeds two products instead of one: on an
// H100 (bench/gpu_runs/2026-11-27-h100-backward-rows.md against -profile-and-recompute.md) the
// BF16 backward at N 4096 took 0.652 ms instead of 0.754 at width 32 and 1.176 instead of 1.300
// at width 64 (there with 32 streamed rows instead of 64 as well: the two were not timed apart),
// TF32's 2.610 instead of 3.001 at width 64, but TF32's at width 32 1.618 instead of 1.443, so it
// keeps 16 there.
struct DefaultTiles {
  int warp_rows, forward_rows, backward_rows, backward_warp_rows;
};
DefaultTiles default_tiles(FlashKernel kernel, int D) {
  const int w = D == 32 ? 0 : D == 64 ? 1 : 2;
  static const DefaultTiles bf16[3] = {{16, 64, 64, 32}, {32, 32, 32, 32}, {32, 64, 64, 16}};
  static const DefaultTiles tf32[3] = {{32, 32, 32, 16}, {32, 64, 32, 32}, {16, 32, 64, 16}};
  // the split kernel's pair rows: the fastest of every tile at N 4096 on an H200
  // (bench/gpu_runs/2026-11-28-h200-split-tf32.md; width 128 runs the FMA kernel)
  static const DefaultTiles tf32x3[3] = {{32, 64, 32, 32}, {32, 64, 32, 16}, {16, 32, 32, 16}};
  return kernel == FlashKernel::bf16 ? bf16[w] : kernel == FlashKernel::tf32 ? tf32[w] : tf32x3[w];
}

// The streamed tiles' buffers (TcTile's Stages): two for every kernel; the split kernel's backward
// at width 64, whose pair rows take 132 KiB with two, may take one, which halves the streamed
// tiles' part (99 KiB: two blocks on an SM instead of one). Only there is one compiled: elsewhere
// ptxas spilled the one-buffer kernels' registers. Unmeasured on a GPU: the default stays two.
constexpr bool one_stage_compiled(FlashKernel kernel, int D, bool forward) {
  return kernel == FlashKernel::tf32x3 && !forward && D == 64;
}

int copy_stages(FlashKernel kernel, int D, bool forward) {
  if (!one_stage_compiled(kernel, D, forward)) return 2;
  return g_copy_stages ? g_copy_stages : 2;
}

template <class M, int D, bool Forward, class Fn>
void with_copy_stages(Fn&& fn) {
  if constexpr (M::kPlanes == 2 && one_stage_compiled(FlashKernel::tf32x3, D, Forward)) {
    if (copy_stages(FlashKernel::tf32x3, D, Forward) == 1) return fn(std::integral_constant<int, 1>{});
  }
  fn(std::integral_constant<int, 2>{});
}

int default_stream_rows(FlashKernel kernel, int D, bool forward) {
  const DefaultTiles t = default_tiles(kernel, D);
  return forward ? t.forward_rows : t.backward_rows;
}

int forward_warp_rows(FlashKernel kernel, int D) {
  return g_warp_rows ? g_warp_rows : default_tiles(kernel, D).warp_rows;
}

int backward_warp_rows_wanted(FlashKernel kernel, int D) {
  return g_warp_rows ? g_warp_rows : default_tiles(kernel, D).backward_warp_rows;
}

size_t g_shared_limit = 0;  // set_flash_shared_limit: 0 the device's

// The most dynamic shared memory a block of this GPU may opt in to (227 KiB on sm_90, 163 KiB
// on sm_80), or the tests' lower limit.
size_t shared_limit() {
  static const size_t limit = [] {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return size_t{48 * 1024};
    return static_cast<size_t>(prop.sharedMemPerBlockOptin);
  }();
  return g_shared_limit ? g_shared_limit : limit;
}

// Which forward tiles keep twice the accumulators (32 rows per warp) in registers: ptxas spills
// with 128-row streamed tiles, and with TF32 at width 128.
constexpr bool two_fit(FlashKernel kernel, int D, int rows) {
  return kernel != FlashKernel::fma && rows <= 64 && !(kernel == FlashKernel::tf32 && D == 128);
}

// Which forward tiles keep 16 rows per warp without spilling: not the split kernel's at width 64
// with 32 streamed rows (ptxas gave it 96 registers and spilled 4 bytes), which runs 32 rows per
// warp there.
constexpr bool one_fits(FlashKernel kernel, int D, int rows) {
  return !(kernel == FlashKernel::tf32x3 && D == 64 && rows == 32);
}

// Which backward tiles keep 32 rows per warp (two score tiles and two gradient accumulators each)
// in registers without spilling (ptxas, sm_90: dK/dV takes 236 registers at width 64 and 32
// streamed rows, and spills at 64).
constexpr bool two_fit_backward(FlashKernel kernel, int D, int rows) {
  if (kernel == FlashKernel::tf32x3) return D == 32 && rows == 32;
  return (kernel == FlashKernel::bf16 || kernel == FlashKernel::tf32) && (D == 32 ? rows <= 64 : D == 64 && rows == 32);
}

// Which backward tiles the fused kernel (dK/dV with dQ's pieces besides) takes without spilling
// (ptxas, sm_90): TF32 at width 32 with 32 rows per warp and 64 streamed rows spills 4 bytes, and
// so do BF16's atomic variant at width 32 with 32 rows per warp and 32 streamed rows and the split
// TF32 kernel's at width 32 with 16 rows per warp and 32 streamed rows; there the split pair runs.
constexpr bool fused_fits(FlashKernel kernel, int D, int rows, int warp_tiles, bool atomic) {
  return !(kernel == FlashKernel::tf32 && D == 32 && rows == 64 && warp_tiles == 2) &&
         !(atomic && kernel == FlashKernel::bf16 && D == 32 && rows == 32 && warp_tiles == 2) &&
         !(atomic && kernel == FlashKernel::tf32x3 && D == 32 && rows == 32 && warp_tiles == 1);
}

// The most streamed rows a kernel's registers take without spilling (ptxas, sm_90): the split
// TF32 operands hold twice the registers, and its backward two score tiles of them.
constexpr int max_stream_rows(FlashKernel kernel, int D, bool forward) {
  if (kernel != FlashKernel::tf32x3) return 128;
  return forward ? (D == 32 ? 128 : 64) : (D == 32 ? 64 : 32);
}

// The backward's streamed tile for the rows stream_rows chose: 128 rows are the forward's alone
// (the backward's two score tiles of 128 columns would not fit the registers).
constexpr int backward_tile_rows(int rows) { return rows == 128 ? 64 : rows; }

int stream_rows(FlashKernel kernel, int D, bool forward) {
  if (max_stream_rows(kernel, D, forward) == 32) return 32;
  const int want = g_stream_rows ? g_stream_rows : default_stream_rows(kernel, D, forward);
  const int rows = want == 32 ? 32 : want == 128 && forward && D <= 64 && max_stream_rows(kernel, D, forward) == 128 ? 128 : 64;
  // the largest tiles (FP32 operands at width 128, or 128 streamed rows) outgrow sm_80's shared
  // memory: 32 rows there
  // the rows per warp that will run at these streamed rows (the wanted ones where they fit)
  const int warp_rows = forward ? (two_fit(kernel, D, rows) ? forward_warp_rows(kernel, D) : 16)
                                : (two_fit_backward(kernel, D, rows) ? backward_warp_rows_wanted(kernel, D) : 16);
  const size_t bytes =
      tile_shared_bytes(kernel, D, rows, warp_rows / kRowsPerWarp, forward ? 1 : 2, false, copy_stages(kernel, D, forward));
  return bytes > shared_limit() ? 32 : rows;
}

template <class M>
constexpr FlashKernel kernel_of() {
  return std::is_same_v<M, Bf16Math>   ? FlashKernel::bf16
         : std::is_same_v<M, Tf32Math> ? FlashKernel::tf32
                                       : FlashKernel::tf32x3;
}

template <class M, int D, bool Forward, class Fn>
void with_stream_rows(Fn&& fn) {
  const int rows = stream_rows(kernel_of<M>(), D, Forward);
  constexpr int most = max_stream_rows(kernel_of<M>(), D, Forward);
  if constexpr (most == 32) {
    fn(std::integral_constant<int, 32>{});
  } else {
    if (rows == 32) fn(std::integral_constant<int, 32>{});
    else if constexpr (D <= 64 && most == 128) {
      if (rows == 128) fn(std::integral_constant<int, 128>{});
      else fn(std::integral_constant<int, 64>{});
    } else {
      fn(std::integral_constant<int, 64>{});
    }
  }
}

// The compiled head-width bound of d: 32, 64 or 128 (with_width's choice).
int width_bound(int d) { return d <= 32 ? 32 : d <= 64 ? 64 : 128; }

// The split kernel's pair rows at width 128 outgrow shared memory (the backward's tiles would
// take 260 KiB): it is not compiled there, and the dispatch runs the FMA kernel instead
// (flash_kernel_that_runs).
template <class M, class Fn>
void with_width(int d, Fn&& fn) {
  if (d <= 32) {
    fn(std::integral_constant<int, 32>{});
  } else if constexpr (M::kPlanes == 2) {
    CAST_CHECK(d <= 64, "flash attention: the split TF32 kernel takes head widths up to 64, not {}", d);
    fn(std::integral_constant<int, 64>{});
  } else {
    if (d <= 64) fn(std::integral_constant<int, 64>{});
    else fn(std::integral_constant<int, 128>{});
  }
}

template <class... Params, class... Args>
void launch_tc(const char* name, void (*kernel)(Params...), dim3 grid, size_t bytes, Args&&... args) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  launch_kernel(name, kernel, grid, dim3(kBlock), bytes, std::forward<Args>(args)...);
  CUDA_CHECK_LAUNCH();
}

dim3 grid_for(int rows, int64_t batch_heads, int block_rows) {
  return dim3(static_cast<unsigned>((rows + block_rows - 1) / block_rows), static_cast<unsigned>(batch_heads));
}

// The operand tensors of one call in the kernel's element type: BF16 copies, the FP32 tensors,
// or the split kernel's pair rows. The copies of a call share one block of device memory, so a
// call asks the caching allocator for one block, not one per operand (a step with other shapes
// after the warm-up then finds a cached block as it did before the copies).
template <class M>
struct Operands {
  using Elem = typename M::Elem;
  Tensor copies;                  // every copy, kept alive for the launches
  std::vector<const Elem*> data;  // each operand's, in the order given

  Operands(std::initializer_list<const Tensor*> xs, int width) {
    if constexpr (std::is_same_v<Elem, float> && M::kPlanes == 1) {
      (void)width;
      for (const Tensor* x : xs) data.push_back(x->data<float>());
    } else {
      // each copy rows × kPlanes·width elements: a multiple of 16 bytes (width % 4 == 0 in FP32,
      // % 8 == 0 in BF16), so every copy starts 16-byte aligned
      int64_t total = 0;
      for (const Tensor* x : xs) total += x->numel() / x->dim(-1) * M::kPlanes * width;
      copies = std::is_same_v<Elem, float> ? Tensor::empty({total}, DType::f32, Device::cuda)
                                           : Tensor::empty({(total + 1) / 2}, DType::i32, Device::cuda);
      Elem* base = reinterpret_cast<Elem*>(copies.raw_data());
      for (const Tensor* x : xs) {
        const int64_t rows = x->numel() / x->dim(-1);
        data.push_back(copy(base, *x, rows, width));
        base += rows * M::kPlanes * width;
      }
    }
  }
  const Elem* operator[](size_t i) const { return data[i]; }

 private:
  static const Elem* copy(Elem* dst, const Tensor& x, int64_t rows, int width) {
    const float* src = x.data<float>();
    if constexpr (M::kPlanes == 2) {
      CAST_LAUNCH(to_tf32_pairs_kernel, blocks_for(rows * width), kThreads, 0, dst, src, rows, width);
    } else {
      const int64_t n = rows * width;
      if (width == x.dim(-1) && width % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
          reinterpret_cast<uintptr_t>(dst) % 16 == 0)
        CAST_LAUNCH(to_bf16_flat_kernel, blocks_for(n / 8), kThreads, 0, reinterpret_cast<uint4*>(dst),
                    reinterpret_cast<const float4*>(src), n / 8);
      else
        CAST_LAUNCH(to_bf16_rows_kernel, blocks_for(n), kThreads, 0, dst, src, rows, static_cast<int>(x.dim(-1)),
                    width);
    }
    CUDA_CHECK_LAUNCH();
    return dst;
  }
};

template <class M>
TcShape tc_shape(const Tensor& q, const Tensor& k) {
  const int d = static_cast<int>(q.dim(3));
  const int width = std::is_same_v<typename M::Elem, float> ? d : (d + 7) / 8 * 8;
  return TcShape{static_cast<int>(q.dim(1)),
                 static_cast<int>(q.dim(2)),
                 static_cast<int>(k.dim(2)),
                 d,
                 width,
                 M::kPlanes * width,
                 1.f / std::sqrt(static_cast<float>(d))};
}

template <class M>
void forward_with(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  const TcShape s = tc_shape<M>(q, k);
  const int64_t BH = q.dim(0) * q.dim(1);
  const Operands<M> ops({&q, &k, &v}, s.width);
  const auto *qe = ops[0], *ke = ops[1], *ve = ops[2];
  with_width<M>(s.d, [&](auto w) {
    constexpr int D = decltype(w)::value;
    with_stream_rows<M, D, true>([&](auto rows) {
      const auto launch_tile = [&](auto warp_tiles, auto stages) {
        using T = TcTile<M, D, decltype(rows)::value, decltype(warp_tiles)::value, decltype(stages)::value>;
        static_assert(T::elements(1) * sizeof(typename M::Elem) ==
                      tile_shared_bytes(kernel_of<M>(), D, T::kStream, T::MI, 1, false, T::kStages));
        for_grid_y_chunks(BH, s.heads, [&](int64_t first, int64_t count) {
          const int64_t qo = first * s.M * s.row, ko = first * s.N * s.row;
          launch_tc("flash_tc_forward_kernel", flash_tc_forward_kernel<M, T>, grid_for(s.M, count, T::kOwnedRows),
                    T::elements(1) * sizeof(typename M::Elem), out.data<float>() + first * s.M * s.d,
                    lse.data<float>() + first * s.M, qe + qo, ke + ko, ve + ko,
                    mask.defined() ? mask.data<float>() + first / s.heads * s.N : nullptr, s);
        });
      };
      const auto launch = [&](auto warp_tiles) {
        with_copy_stages<M, D, true>([&](auto stages) { launch_tile(warp_tiles, stages); });
      };
      constexpr int BN = decltype(rows)::value;
      if constexpr (two_fit(kernel_of<M>(), D, BN)) {
        if (forward_warp_rows(kernel_of<M>(), D) == 32 || !one_fits(kernel_of<M>(), D, BN))
          return launch(std::integral_constant<int, 2>{});
      }
      if constexpr (one_fits(kernel_of<M>(), D, BN)) launch(std::integral_constant<int, 1>{});
    });
  });
}

template <class M>
void backward_with(Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                   const Tensor& v, const Tensor& mask, const Tensor& lse, const Tensor& delta) {
  const TcShape s = tc_shape<M>(q, k);
  const int64_t BH = q.dim(0) * q.dim(1);
  const Operands<M> ops({&q, &k, &v, &dout}, s.width);
  const auto *qe = ops[0], *ke = ops[1], *ve = ops[2], *ge = ops[3];
  const float* m = mask.defined() ? mask.data<float>() : nullptr;
  with_width<M>(s.d, [&](auto w) {
    constexpr int D = decltype(w)::value;
    with_stream_rows<M, D, false>([&](auto rows) {
      constexpr int BS = backward_tile_rows(decltype(rows)::value);
      const auto launch_tile = [&](auto warp_tiles, auto stages) {
        using T = TcTile<M, D, BS, decltype(warp_tiles)::value, decltype(stages)::value>;
        const size_t bytes = T::elements(2) * sizeof(typename M::Elem);
        [[maybe_unused]] const size_t fused_bytes = T::elements(2, true) * sizeof(typename M::Elem);
        static_assert(T::elements(2, true) * sizeof(typename M::Elem) ==
                      tile_shared_bytes(kernel_of<M>(), D, BS, T::MI, 2, true, T::kStages));
        // the one decision, which the benchmarks' labels read too
        constexpr bool fits = fused_fits(kernel_of<M>(), D, BS, T::MI, false),
                       atomic_fits = fused_fits(kernel_of<M>(), D, BS, T::MI, true);
        const bool fused = dq && (dk || dv) && flash_backward_runs_fused(kernel_of<M>(), s.d);
        const bool in_turn = fused && g_backward == FlashBackward::fused;
        const int64_t tiles = (s.M + BS - 1) / BS;
        // a flag per (batch-head, query tile): whose turn it is to add to that tile of dq
        const Tensor turns = in_turn ? Tensor::zeros({BH * tiles}, DType::i32, Device::cuda) : Tensor();
        for_grid_y_chunks(BH, s.heads, [&](int64_t first, int64_t count) {
          const int64_t qo = first * s.M * s.row, ko = first * s.N * s.row, ro = first * s.M;
          const float* mc = m ? m + first / s.heads * s.N : nullptr;
          const auto launch_dkdv = [&](const char* name, auto kernel, size_t kernel_bytes, float* dq_or_null,
                                       int* turns_or_null) {
            launch_tc(name, kernel, grid_for(s.N, count, T::kOwnedRows), kernel_bytes,
                      dk ? dk->data<float>() + first * s.N * s.d : nullptr,
                      dv ? dv->data<float>() + first * s.N * s.d : nullptr, dq_or_null, turns_or_null, ge + qo, qe + qo,
                      ke + ko, ve + ko, mc, lse.data<float>() + ro, delta.data<float>() + ro, s);
          };
          if constexpr (fits) {  // not compiled where it would spill
            if (in_turn)
              return launch_dkdv("flash_tc_dkdv_kernel<in_turn>", flash_tc_dkdv_kernel<M, T, DqAdd::in_turn>,
                                 fused_bytes,
                                 dq->data<float>() + first * s.M * s.d,
                                 const_cast<int*>(turns.data<int32_t>()) + first * tiles);
          }
          if constexpr (atomic_fits) {
            if (fused && !in_turn)
              return launch_dkdv("flash_tc_dkdv_kernel<atomic>", flash_tc_dkdv_kernel<M, T, DqAdd::atomic>,
                                 fused_bytes,
                                 dq->data<float>() + first * s.M * s.d, nullptr);
          }
          if (dq)
            launch_tc("flash_tc_dq_kernel", flash_tc_dq_kernel<M, T>, grid_for(s.M, count, T::kOwnedRows), bytes,
                      dq->data<float>() + first * s.M * s.d, ge + qo, qe + qo, ke + ko, ve + ko, mc,
                      lse.data<float>() + ro, delta.data<float>() + ro, s);
          if (dk || dv)
            launch_dkdv("flash_tc_dkdv_kernel<none>", flash_tc_dkdv_kernel<M, T, DqAdd::none>, bytes, nullptr,
                        nullptr);
        });
      };
      const auto launch = [&](auto warp_tiles) {
        with_copy_stages<M, D, false>([&](auto stages) { launch_tile(warp_tiles, stages); });
      };
      if constexpr (two_fit_backward(kernel_of<M>(), D, BS)) {
        if (backward_warp_rows_wanted(kernel_of<M>(), D) == 32) return launch(std::integral_constant<int, 2>{});
      }
      launch(std::integral_constant<int, 1>{});
    });
  });
}

template <class Fn>
void with_math(FlashKernel kernel, Fn&& fn) {
  switch (kernel) {
    case FlashKernel::bf16: fn(Bf16Math{}); break;
    case FlashKernel::tf32: fn(Tf32Math{}); break;
    case FlashKernel::tf32x3: fn(Tf32x3Math{}); break;
    default: CAST_CHECK(false, "flash attention: kernel {} is not a tensor-core kernel", flash_kernel_name(kernel));
  }
}

}  // namespace

void flash_tc_forward(FlashKernel kernel, Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& mask) {
  with_math(kernel, [&](auto math) { forward_with<decltype(math)>(out, lse, q, k, v, mask); });
}

void flash_tc_backward(FlashKernel kernel, Tensor* dq, Tensor* dk, Tensor* dv, const Tensor& dout, const Tensor& q,
                       const Tensor& k, const Tensor& v, const Tensor& mask, const Tensor& lse, const Tensor& delta) {
  with_math(kernel, [&](auto math) { backward_with<decltype(math)>(dq, dk, dv, dout, q, k, v, mask, lse, delta); });
}

void set_flash_stream_rows(int rows) {
  CAST_CHECK(rows == 0 || rows == 32 || rows == 64 || rows == 128,
             "flash attention: streamed tiles of {} rows "
             "(0: the defaults, or 32, 64, 128)",
             rows);
  g_stream_rows = rows;
}

void set_flash_warp_rows(int rows) {
  CAST_CHECK(rows == 0 || rows == 16 || rows == 32, "flash attention: {} rows per warp (0: the default, or 16, 32)",
             rows);
  g_warp_rows = rows;
}

void set_flash_copy_stages(int stages) {
  CAST_CHECK(stages == 0 || stages == 1 || stages == 2,
             "flash attention: {} buffers of streamed tiles (0: the defaults, or 1, 2)", stages);
  g_copy_stages = stages;
}

int flash_copy_stages(FlashKernel kernel, int d, bool forward) { return copy_stages(kernel, width_bound(d), forward); }

void set_flash_backward(FlashBackward backward) { g_backward = backward; }
FlashBackward flash_backward() { return g_backward; }

int flash_warp_rows(FlashKernel kernel, int d) {
  const int D = width_bound(d), rows = stream_rows(kernel, D, true);
  if (!one_fits(kernel, D, rows)) return 32;
  return two_fit(kernel, D, rows) ? forward_warp_rows(kernel, D) : 16;
}

int flash_backward_warp_rows(FlashKernel kernel, int d) {
  const int D = width_bound(d);
  return two_fit_backward(kernel, D, stream_rows(kernel, D, false)) ? backward_warp_rows_wanted(kernel, D) : 16;
}

// The shared memory of the tiles that would run, forward and backward, within the device's: not
// on every GPU at every width (the split kernel's pair rows at width 64 take 132 KiB where
// sm_86 and sm_89 give a block 99 KiB), and then the FMA kernel runs (flash_kernel_that_runs).
bool flash_tc_fits(FlashKernel kernel, int d) {
  if (kernel == FlashKernel::fma) return true;
  if (kernel == FlashKernel::tf32x3 && d > 64) return false;  // not compiled (with_width)
  const int D = width_bound(d), forward_rows = stream_rows(kernel, D, true),
            backward_rows = backward_tile_rows(stream_rows(kernel, D, false));
  const size_t forward_bytes = tile_shared_bytes(kernel, D, forward_rows, flash_warp_rows(kernel, d) / kRowsPerWarp, 1,
                                                 false, copy_stages(kernel, D, true));
  const size_t backward_bytes =
      tile_shared_bytes(kernel, D, backward_rows, flash_backward_warp_rows(kernel, d) / kRowsPerWarp, 2,
                        flash_backward_runs_fused(kernel, d), copy_stages(kernel, D, false));
  return forward_bytes <= shared_limit() && backward_bytes <= shared_limit();
}

void set_flash_shared_limit(size_t bytes) { g_shared_limit = bytes; }

bool flash_backward_runs_fused(FlashKernel kernel, int d) {
  if (kernel == FlashKernel::fma || g_backward == FlashBackward::split) return false;
  if (kernel == FlashKernel::tf32x3 && d > 64) return false;  // the FMA kernels run (with_width)
  const int D = width_bound(d), BS = backward_tile_rows(stream_rows(kernel, D, false));
  const int warp_tiles = flash_backward_warp_rows(kernel, d) / kRowsPerWarp;
  return fused_fits(kernel, D, BS, warp_tiles, g_backward == FlashBackward::fused_atomic) &&
         tile_shared_bytes(kernel, D, BS, warp_tiles, 2, true, copy_stages(kernel, D, false)) <= shared_limit();
}

int flash_stream_rows(FlashKernel kernel, int d, bool forward) {
  return stream_rows(kernel, width_bound(d), forward);
}

std::vector<KernelLaunchShape> flash_tc_launch_shapes() {
  std::vector<KernelLaunchShape> shapes;
  const auto add = [&](auto math, const char* math_name) {
    using M = decltype(math);
    constexpr FlashKernel kernel = kernel_of<M>();
    // `flag`: the dK/dV kernel's DqAdd ("" for the kernels without one)
    const auto push = [&](const char* name, int D, int rows, int warp_tiles, int owned_tiles, bool with_ds = false,
                          const char* flag = "") {
      for (int stages : {1, 2}) {
        if (stages == 1 && !one_stage_compiled(kernel, D, owned_tiles == 1)) continue;  // with_copy_stages
        shapes.push_back({fmt::format("{}<{}, TcTile<{}, {}, {}, {}, {}>{}>", name, math_name, math_name, D, rows,
                                      warp_tiles, stages, flag),
                          kBlock, tile_shared_bytes(kernel, D, rows, warp_tiles, owned_tiles, with_ds, stages)});
      }
    };
    // every tile the dispatch compiles (with_stream_rows, two_fit, two_fit_backward)
    for (int D : {32, 64, 128}) {
      if (M::kPlanes == 2 && D > 64) continue;  // with_width
      for (int rows : {32, 64, 128}) {
        const int most_f = max_stream_rows(kernel, D, true);
        if (rows > most_f || (rows == 128 && D > 64)) continue;
        if (one_fits(kernel, D, rows)) push("flash_tc_forward_kernel", D, rows, 1, 1);
        if (two_fit(kernel, D, rows)) push("flash_tc_forward_kernel", D, rows, 2, 1);
      }
      for (int rows : {32, 64}) {
        if (rows > max_stream_rows(kernel, D, false)) continue;
        for (int warp_tiles : {1, 2}) {
          if (warp_tiles == 2 && !two_fit_backward(kernel, D, rows)) continue;
          push("flash_tc_dq_kernel", D, rows, warp_tiles, 2);
          // the DqAdd argument as the demangled kernel name spells it
          push("flash_tc_dkdv_kernel", D, rows, warp_tiles, 2, false, ", (DqAdd)0");
          if (fused_fits(kernel, D, rows, warp_tiles, false))
            push("flash_tc_dkdv_kernel", D, rows, warp_tiles, 2, true, ", (DqAdd)1");
          if (fused_fits(kernel, D, rows, warp_tiles, true))
            push("flash_tc_dkdv_kernel", D, rows, warp_tiles, 2, true, ", (DqAdd)2");
        }
      }
    }
  };
  add(Bf16Math{}, "Bf16Math");
  add(Tf32Math{}, "Tf32MathT<false>");
  add(Tf32x3Math{}, "Tf32MathT<true>");
  return shapes;
}

}  // namespace cast::cuda
