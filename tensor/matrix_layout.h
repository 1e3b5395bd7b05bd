#pragma once
// Where a batch of row-major matrices lies inside a tensor's elements, when that is not packed
// one after another: matrix i starts at element `offset + i · stride`, and its rows are `ld`
// elements apart (ld at least the row's length; stride 0 repeats one matrix for the whole batch).
// The attention layer's projections read and write the heads (B, H, N, d) in place this way, and
// one head's columns of a weight (D, H·d), instead of through a permuted copy.
#include <cstdint>

namespace cast {

struct MatrixLayout {
  int64_t offset = 0, ld = 0, stride = 0;
};

}  // namespace cast
