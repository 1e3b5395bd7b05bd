#pragma once
// BF16 (bfloat16): FP32's sign and 8-bit exponent with 7 stored mantissa bits, as 16 bits. The
// engine's storage dtype for BF16 tensors (DType::bf16), converted from FP32 by rounding to the
// nearest value, ties to even; infinities stay infinities, a NaN stays a NaN of the same sign
// (quieted), and a finite value beyond BF16's largest (3.3895e38) rounds to infinity. Both
// compilers read this file, so the CPU and the GPU convert bit for bit alike.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/hd.h"

namespace cast {

// The storage element of a DType::bf16 tensor.
struct bfloat16 {
  uint16_t bits;
};

CAST_HD uint16_t bf16_bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN, quieted
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The same rounding from a double, rounded once: the double goes to the float just below it in
// magnitude with its last bit set where it is not exact (round to odd), and that float, which
// carries 16 more bits than a bf16, rounds to the same bf16 the double would.
inline uint16_t bf16_bits_of_double(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) != x && x == x && f - f == 0.f) {  // inexact, finite
    if (std::abs(static_cast<double>(f)) > std::abs(x)) f = std::nextafter(f, 0.f);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return bf16_bits_of(f);
}

CAST_HD float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace cast
