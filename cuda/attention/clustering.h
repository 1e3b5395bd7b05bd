#pragma once
#include "tensor/tensor.h"

namespace cast::cuda {
// CAST Top-K clustering on the device (ops/attention/clustering.h): affinity (G, N, C) f32, mask (B, N)
// or undefined, out (G, C, kappa) i32. The same members as the CPU op, bit for bit.
void cluster_topk(Tensor& out, const Tensor& affinity, const Tensor& mask, int64_t kappa);
// Single-Assignment Top-K, LSH hashing and Hamming k-means on the device (ops/attention/clustering.h), each
// equal to the CPU op bit for bit. affinity (G, N, C) f32 -> out (G, C, kappa) i32; q (G, N, d)
// f32 and planes (bits, d + 1) f32 -> out (G, N) i64; hashes (G, N) i64 -> assign (G, N) i32.
void cluster_satopk(Tensor& out, const Tensor& affinity, const Tensor& mask, int64_t kappa);
void lsh_hash(Tensor& out, const Tensor& q, const Tensor& planes);
void hamming_kmeans(Tensor& assign, const Tensor& hashes, const Tensor& mask, int64_t clusters, int64_t iterations,
                    uint64_t seed);
// mask (same element count as members) = 1 where a slot holds a token, 0 where it is empty (−1).
void slot_mask(Tensor& mask, const Tensor& members);

}  // namespace cast::cuda
