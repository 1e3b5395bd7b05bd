#pragma once
// The small products inside the fused CPU attention kernels (a 64 × 128 score tile against a
// head width of 64, and the like), written for registers rather than handed to the BLAS.
//
// A BLAS is built for large products: for each call it packs both operands, takes buffers and
// walks its blocking logic, which at these sizes costs as much as the arithmetic (OpenBLAS ran
// the flash tiles at about 60% of its own large-product rate). Here op(b) is packed once into
// panels of kCols columns, and a register-blocked kernel of kRows × kCols accumulators streams
// op(a) against each panel. f64 (the gradient checks) keeps the BLAS.
#include <cstddef>
#include <cstdint>

namespace cast::ops {

// c (m, n) = alpha op(a) op(b) + beta c; row-major, packed operands (a (m, k) or (k, m) with
// trans_a, b (k, n) or (n, k) with trans_b). beta = 0 never reads c. Runs on the calling thread.
void gemm_tile_kernel(float* c, const float* a, const float* b, bool trans_a, bool trans_b, float alpha, float beta,
                      int64_t m, int64_t n, int64_t k);

// The same product in two parts, for an op(b) that several products share (a key tile against
// every query tile): pack_b writes op(b) into packed_floats(n, k) floats as the kernel reads it,
// and gemm_tile_packed multiplies by it.
size_t packed_floats(int64_t n, int64_t k);
void pack_b(float* packed, const float* b, bool trans_b, int64_t n, int64_t k);
void gemm_tile_packed(float* c, const float* a, bool trans_a, const float* packed_b, float alpha, float beta, int64_t m,
                      int64_t n, int64_t k);

// A whole small product on every thread, rows of c split among them: what matmul runs on the
// CPU for f32 where the BLAS would spend more time packing and setting up than multiplying (the
// small model's projections and MLP: 1568 × 64 × 64). Batched over `batch` packed products.
bool gemm_small_fits(int64_t m, int64_t n, int64_t k);
void gemm_small(float* c, const float* a, const float* b, bool trans_a, bool trans_b, float alpha, float beta,
                int64_t batch, int64_t m, int64_t n, int64_t k);

// Which kernel gemm_tile (ops/matmul.h) runs for f32: this one (the default) or the BLAS, for
// comparison (`cast bench --tile-gemm blas`).
enum class TileGemm { kernel, blas };
void set_tile_gemm(TileGemm which);
TileGemm tile_gemm();

}  // namespace cast::ops
