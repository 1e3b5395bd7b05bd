#pragma once
// The order of a column sum, written once for the CPU op (ops/reduce.cpp) and the CUDA kernels
// (cuda/reduce.cu, cuda/attention/cluster_summaries_fused.cu): the n rows are summed in chunks
// of kSumChunk rows, each chunk from 0 in row order, then the chunk sums in chunk order. A
// two-stage reduction that the GPU runs in parallel and the CPU across its threads, in the same
// order, so both give the same bits.
#include <cstdint>

namespace cast {
constexpr int64_t kSumChunk = 256;
}  // namespace cast
