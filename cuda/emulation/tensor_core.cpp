// The emulation's models of the tensor-core instructions of cuda/tensor_core.cuh: mma.sync in
// its TF32 and BF16 shapes, ldmatrix .x4 with and without .trans, and the number formats. Each
// instruction gathers the registers of all 32 lanes (emu::warp_exchange), places every element
// where the PTX ISA's fragment layouts put it, computes, and hands each lane its part.
#include <cmath>
#include <cstring>
#include <limits>

#include "cuda/emulation/emulator.h"
#include "cuda/tensor_core.cuh"

namespace cast::cuda::tc {

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
float bf16_value(uint16_t h) { return float_of(uint32_t{h} << 16); }

// The registers one lane hands to an mma: A, B and its accumulators.
struct MmaLane {
  const uint32_t* a;
  const uint32_t* b;
  float* d;
};

// FP32 nearest to x in the direction of zero.
float toward_zero(double x) {
  const float f = static_cast<float>(x);
  return std::abs(static_cast<double>(f)) > std::abs(x) ? std::nextafter(f, 0.f) : f;
}

// D = A B + C for a 16×8 tile over k = K, with A(r, k) and B(k, n) read through the layout of
// the shape (Element: the value at (lane, register, half)). Products are exact in both formats
// (11 × 11 and 8 × 8 significant bits fit in a float); the sum is taken in double and rounded
// once toward zero. The PTX ISA leaves the order and rounding of the sum open; the tensor cores
// cut low bits off rather than round (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior
// of NVIDIA tensor cores", 2021). This model of that, the sum cut once, gives a running sum
// carried through the split-TF32 kernel's mma about the error an H200 measured (6.7e-6 here
// against 5.0e-6 there, at N 1024: ten times the FP32 FMA kernel's), so that a kernel which
// carries its sums that way fails here as on the GPU (docs/engine.md).
template <int K, class AElement, class BElement>
void mma_tile(void* const* lanes, AElement a_at, BElement b_at) {
  float A[16][K], B[K][8];
  for (int lane = 0; lane < 32; ++lane) {
    const auto* l = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    a_at(A, l->a, g, t);
    b_at(B, l->b, g, t);
  }
  for (int lane = 0; lane < 32; ++lane) {
    auto* l = static_cast<const MmaLane*>(lanes[lane]);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      double sum = 0.0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
      l->d[i] = toward_zero(sum + l->d[i]);
    }
  }
}

void apply_tf32(void* const* lanes) {
  mma_tile<8>(
      lanes,
      [](float (&A)[16][8], const uint32_t* a, int g, int t) {
        A[g][t] = tf32_value(a[0]), A[g + 8][t] = tf32_value(a[1]);
        A[g][t + 4] = tf32_value(a[2]), A[g + 8][t + 4] = tf32_value(a[3]);
      },
      [](float (&B)[8][8], const uint32_t* b, int g, int t) {
        B[t][g] = tf32_value(b[0]), B[t + 4][g] = tf32_value(b[1]);
      });
}

void apply_bf16(void* const* lanes) {
  const auto lo = [](uint32_t r) { return bf16_value(static_cast<uint16_t>(r & 0xffffu)); };
  const auto hi = [](uint32_t r) { return bf16_value(static_cast<uint16_t>(r >> 16)); };
  mma_tile<16>(
      lanes,
      [&](float (&A)[16][16], const uint32_t* a, int g, int t) {
        for (int i = 0; i < 4; ++i) {
          const int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
          A[row][col] = lo(a[i]), A[row][col + 1] = hi(a[i]);
        }
      },
      [&](float (&B)[16][8], const uint32_t* b, int g, int t) {
        for (int i = 0; i < 2; ++i) B[2 * t + 8 * i][g] = lo(b[i]), B[2 * t + 8 * i + 1][g] = hi(b[i]);
      });
}

struct LdmatrixLane {
  const uint32_t* row;  // the 16 bytes at the address this lane gave
  uint32_t* r;
};

uint16_t half_of(const uint32_t* row, int element) {
  return static_cast<uint16_t>(row[element / 2] >> (16 * (element % 2)));
}

template <bool Trans>
void apply_ldmatrix(void* const* lanes) {
  const auto at = [&](int lane) { return static_cast<const LdmatrixLane*>(lanes[lane]); };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int m = 0; m < 4; ++m) {
      if (!Trans) {
        at(lane)->r[m] = at(8 * m + g)->row[t];
      } else {
        const uint32_t low = half_of(at(8 * m + 2 * t)->row, g), high = half_of(at(8 * m + 2 * t + 1)->row, g);
        at(lane)->r[m] = low | high << 16;
      }
    }
  }
}

}  // namespace

uint32_t to_tf32(float x) {
  if (std::isnan(x)) return 0x7fffffffu;
  const uint32_t u = bits_of(x);
  // round to nearest, ties away from zero, to 10 stored mantissa bits; a carry moves into the
  // exponent and may reach infinity, as the rounding of a value that large should
  return (u + 0x1000u) & 0xffffe000u;
}

uint16_t to_bf16(float x) {
  if (std::isnan(x)) return 0x7fff;  // the canonical NaN, as the GPU's conversion
  const uint32_t u = bits_of(x);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even
  return static_cast<uint16_t>(rounded >> 16);
}

uint32_t pack_bf16(float lo, float hi) { return uint32_t{to_bf16(lo)} | uint32_t{to_bf16(hi)} << 16; }

float tf32_value(uint32_t bits) {
  const float x = float_of(bits);
  return std::isnan(x) ? x : float_of(bits & 0xffffe000u);  // the low 13 bits take no part
}

float ex2_approx(float x) {
  const float r = static_cast<float>(std::exp2(static_cast<double>(x)));
  return r < std::numeric_limits<float>::min() ? 0.f : r;  // .ftz: no subnormal result (NaN passes)
}

void mma_tf32_at(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char* file, int line) {
  MmaLane lane{a, b, d};
  emu::warp_exchange(0xffffffffu, &lane, apply_tf32, file, line);
}

void mma_bf16_at(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char* file, int line) {
  MmaLane lane{a, b, d};
  emu::warp_exchange(0xffffffffu, &lane, apply_bf16, file, line);
}

void ldmatrix_x4_at(uint32_t (&r)[4], const uint32_t (&row)[4], bool trans, const char* file, int line) {
  LdmatrixLane lane{row, r};
  emu::warp_exchange(0xffffffffu, &lane, trans ? apply_ldmatrix<true> : apply_ldmatrix<false>, file, line);
}

}  // namespace cast::cuda::tc
