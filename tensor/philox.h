#pragma once
// Philox-4x32-10, a counter-based generator: the numbers depend only on (seed, counter),
// so the CPU and a CUDA kernel produce identical streams without sharing state.
#include <cstdint>
#include <cmath>

#include "tensor/hd.h"

namespace cast::philox {

struct Block {
  uint32_t v[4];
};

CAST_HD uint32_t mulhi(uint32_t a, uint32_t b) { return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32); }

// Four 32-bit random words for counter `ctr` under key `seed`.
CAST_HD Block generate(uint64_t seed, uint64_t ctr) {
  uint32_t c0 = static_cast<uint32_t>(ctr), c1 = static_cast<uint32_t>(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0 = mulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    uint32_t hi1 = mulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 bits (exact in float and double alike).
CAST_HD double to_unit(uint32_t word) { return static_cast<double>(word >> 8) * (1.0 / 16777216.0); }

CAST_HD double uniform(uint64_t seed, uint64_t ctr) { return to_unit(generate(seed, ctr).v[0]); }

// to_unit(word) >= p, as a test on the word alone: to_unit keeps the top 24 bits, so the test
// is those bits >= ceil(p · 2^24), both sides exact.
inline uint32_t unit_threshold(double p) { return static_cast<uint32_t>(std::ceil(p * 16777216.0)); }
CAST_HD bool unit_at_least(uint32_t word, uint32_t threshold) { return (word >> 8) >= threshold; }

// out[j] = generate(seed, ctr + j).v[0] for j in [0, n): the words uniform() reads, computed
// for many counters at once. The same rounds as generate(), in 32-bit arithmetic with no
// branch, so the compiler runs them in vector lanes (a call of uniform() per element did not
// vectorise, and made dropout a fifth of a training step).
inline void first_words(uint64_t seed, uint64_t ctr, int64_t n, uint32_t* out) {
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t ctr_lo = static_cast<uint32_t>(ctr), ctr_hi = static_cast<uint32_t>(ctr >> 32);
  for (int64_t j = 0; j < n; ++j) {
    uint32_t c0 = ctr_lo + static_cast<uint32_t>(j);
    uint32_t c1 = ctr_hi + (c0 < ctr_lo ? 1u : 0u), c2 = 0, c3 = 0;  // the carry of ctr + j
    uint32_t k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      const uint32_t n0 = mulhi(0xCD9E8D57u, c2) ^ c1 ^ k0, n2 = mulhi(0xD2511F53u, c0) ^ c3 ^ k1;
      c1 = 0xCD9E8D57u * c2;
      c3 = 0xD2511F53u * c0;
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    out[j] = c0;
  }
}

// Standard normal by Box-Muller on two words of the same block.
CAST_HD double normal(uint64_t seed, uint64_t ctr) {
  Block b = generate(seed, ctr);
  double u1 = (static_cast<double>(b.v[0] >> 8) + 1.0) * (1.0 / 16777217.0);  // (0, 1]
  double u2 = to_unit(b.v[1]);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// A host-side cursor over one stream, for generators that draw many numbers in sequence.
struct Stream {
  uint64_t seed = 0, counter = 0;
  double uniform() { return philox::uniform(seed, counter++); }
  int integer(int lo, int hi) {  // uniform in [lo, hi]
    const int r = lo + static_cast<int>(uniform() * (hi - lo + 1));
    return r > hi ? hi : r;
  }
};

}  // namespace cast::philox
