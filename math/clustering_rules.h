#pragma once
// The random choices of Hamming k-means, written once for the CPU op and the CUDA kernel so
// that both draw the same numbers. Each group has its own Philox stream (counter g·2^32 + k):
// a group's choices do not depend on how many draws the groups before it made, so the groups
// can run in parallel and still match.
#include <cstdint>

#include "tensor/hd.h"
#include "tensor/philox.h"

namespace cast {

// Draw k of group g: uniform in [0, 1).
CAST_HD double kmeans_draw(uint64_t seed, int64_t group, int64_t k) {
  return philox::uniform(seed, (static_cast<uint64_t>(group) << 32) + static_cast<uint64_t>(k));
}

// A position in [0, count) from a uniform draw.
CAST_HD int64_t draw_below(double u, int64_t count) {
  const int64_t i = static_cast<int64_t>(u * static_cast<double>(count));
  return i < count - 1 ? i : count - 1;
}

}  // namespace cast
