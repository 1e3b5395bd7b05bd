#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/attention/affinity_rows.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

// CAST steps 1–2 fused on the CPU: the affinities A = f(X Sᵀ/√w) of the queries (or keys) to
// the surrogate tokens, f the softmax over the C clusters or the Laplace rows. The reference
// (ops/attention/cluster_affinities.cpp) runs the product as one batched call that writes the (B, G, N, C) scores,
// keeps them for the backward and normalises them in a second pass, with a copy of S per batch
// row. Here a task takes 64 rows of one group: their score tile is computed into the output and
// normalised while it is in cache, and nothing but A (and, for Laplace, each row's sum) is kept.
// The backward forms each tile's score gradient in cache and multiplies it out at once; the
// Laplace backward recomputes its tile of scores rather than keeping them.
namespace cast::ops {

namespace {

struct AffinityShape {
  int64_t BG, G, N, C, w;  // BG = B·G groups of rows; group bg uses the surrogates of bg % G
};
constexpr int64_t kTileRows = 64;    // a 64 × C score tile and its 64 × w rows of X stay in cache
constexpr int64_t kChunkRows = 256;  // the rows a backward task multiplies out at once, and sums dS over

using affinity_rows::laplace_row;

// a: (BG, N, C) = f-rows of (x (BG, N, w) · s (G, C, w)ᵀ · factor); total (BG, N): Laplace's row sums
template <class T>
void affinities_forward(const AffinityShape& s, const T* x, const T* sur, AttentionFn f, T factor, T* a, T* total) {
  const int64_t tiles = (s.N + kTileRows - 1) / kTileRows;
  CAST_OMP("omp parallel if (s.BG * s.N * s.C > 16384)")
  {
    TileOperand<T> s_t;  // Sᵀ of one group, packed once for all its tiles on this thread
    int64_t packed = -1;
    CAST_OMP("omp for schedule(static)")
    for (int64_t task = 0; task < s.BG * tiles; ++task) {
      const int64_t bg = task / tiles, r0 = (task % tiles) * kTileRows, rows = std::min(kTileRows, s.N - r0);
      if (packed != bg % s.G) s_t.set(sur + (bg % s.G) * s.C * s.w, true, s.C, s.w), packed = bg % s.G;
      T* tile = a + (bg * s.N + r0) * s.C;
      s_t.multiply(tile, x + (bg * s.N + r0) * s.w, false, factor, T(0), rows);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = tile + r * s.C;
        if (f == AttentionFn::softmax) softmax_row<T>(row, row, nullptr, s.C, false);
        else total[bg * s.N + r0 + r] = laplace_row(row, s.C);
      }
    }
  }
}

// The score gradient of one tile, from the gradient of A: softmax: A ⊙ (dA − Σ A·dA); Laplace:
// f'(x) (dA − Σ A·dA) / total, with the tile's scores recomputed into ds first.
template <class T>
void score_gradient_tile(T* ds, const T* da, const T* a, const T* total, const T* x, const T* sur, AttentionFn f,
                         T factor, int64_t rows, int64_t C, int64_t w) {
  if (f == AttentionFn::softmax) {
    std::fill(ds, ds + rows * C, T(0));
    for (int64_t r = 0; r < rows; ++r) softmax_row_backward<T>(ds + r * C, da + r * C, a + r * C, nullptr, C, false);
    return;
  }
  gemm_tile<T>(ds, x, sur, false, true, factor, T(0), rows, C, w);  // the scores again
  for (int64_t r = 0; r < rows; ++r)
    affinity_rows::laplace_gradient_row(ds + r * C, da + r * C, a + r * C, total[r], C);
}

// dx += factor dS S, and dsur += factor Σ dSᵀ X. A task forms the score gradient of a chunk of
// 256 rows (64 KiB at C 64: it stays in L2) and multiplies it out in two products of the whole
// chunk, which run the tile kernel near its rate where 64-row products did not. Each chunk's
// dsur is summed apart and the chunks added in order, so the result does not depend on the
// number of threads.
template <class T>
void affinities_backward(const AffinityShape& s, const T* x, const T* sur, AttentionFn f, T factor, const T* a,
                         const T* total, const T* da, T* dx, T* dsur) {
  const int64_t chunks = (s.N + kChunkRows - 1) / kChunkRows;
  std::vector<T> partial(dsur ? s.BG * chunks * s.C * s.w : 0, T(0));
  CAST_OMP("omp parallel if (s.BG * s.N * s.C > 16384)")
  {
    std::vector<T> ds(kChunkRows * s.C);
    CAST_OMP("omp for schedule(static)")
    for (int64_t task = 0; task < s.BG * chunks; ++task) {
      const int64_t bg = task / chunks, r0 = (task % chunks) * kChunkRows, rows = std::min(kChunkRows, s.N - r0);
      const int64_t at = bg * s.N + r0;
      const T* s_g = sur + (bg % s.G) * s.C * s.w;
      for (int64_t t0 = 0; t0 < rows; t0 += kTileRows)  // the score gradient, a cache-sized tile at a time
        score_gradient_tile<T>(ds.data() + t0 * s.C, da + (at + t0) * s.C, a + (at + t0) * s.C,
                               total ? total + at + t0 : nullptr, x + (at + t0) * s.w, s_g, f, factor,
                               std::min(kTileRows, rows - t0), s.C, s.w);
      if (dx) gemm_tile<T>(dx + at * s.w, ds.data(), s_g, false, false, factor, T(1), rows, s.w, s.C);
      if (dsur)
        gemm_tile<T>(partial.data() + task * s.C * s.w, ds.data(), x + at * s.w, true, false, factor, T(0), s.C, s.w,
                     rows);
    }
  }
  if (!dsur) return;
  for (int64_t task = 0; task < s.BG * chunks; ++task) {  // in order: g's sum runs over b, then chunks
    T* out = dsur + ((task / chunks) % s.G) * s.C * s.w;
    const T* p = partial.data() + task * s.C * s.w;
    for (int64_t e = 0; e < s.C * s.w; ++e) out[e] += p[e];
  }
}

AffinityShape shape_of(const Tensor& x, const Tensor& s) {
  return {x.dim(0) * x.dim(1), x.dim(1), x.dim(2), s.dim(1), x.dim(3)};
}

struct ClusterAffinitiesFusedNode final : autograd::Node {
  Tensor x, s;    // inputs (B, G, N, w), (G, C, w)
  Tensor a;       // saved output A (B, G, N, C)
  Tensor total;   // saved Laplace row sums (B, G, N); undefined for the softmax
  AttentionFn f;  // softmax or Laplace rows
  const char* name() const override { return "cluster_affinities_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("s", s);
    visit.saved("a", a);
    visit.saved("total", total);
  }
  void backward() override {
    Tensor dx = x.requires_grad() ? x.grad_accumulator() : Tensor();
    Tensor ds = s.requires_grad() ? s.grad_accumulator() : Tensor();
    CAST_DISPATCH_FLOAT(x.dtype(), "cluster_affinities_fused", [&] {
      const T factor = static_cast<T>(1.0 / std::sqrt(static_cast<double>(x.dim(3))));
      affinities_backward<T>(shape_of(x, s), x.data<T>(), s.data<T>(), f, factor, a.data<T>(),
                             total.defined() ? total.data<T>() : nullptr, outputs[0].grad().data<T>(),
                             dx.defined() ? dx.data<T>() : nullptr, ds.defined() ? ds.data<T>() : nullptr);
    });
  }
};

}  // namespace

Tensor cluster_affinities_fused(const Tensor& x, const Tensor& s, AttentionFn f) {
  const char* op = "cluster_affinities_fused";
  check_cluster_affinities_inputs(op, x, s);
  CAST_CHECK(!x.is_cuda(), "{}: a CPU kernel, got x {}", op, x.describe());
  const AffinityShape sh = shape_of(x, s);
  Tensor a = Tensor::empty({x.dim(0), sh.G, sh.N, sh.C}, x.dtype());
  Tensor total = f == AttentionFn::laplace ? Tensor::empty({x.dim(0), sh.G, sh.N}, x.dtype()) : Tensor();
  CAST_DISPATCH_FLOAT(x.dtype(), op, [&] {
    const T factor = static_cast<T>(1.0 / std::sqrt(static_cast<double>(sh.w)));
    affinities_forward<T>(sh, x.data<T>(), s.data<T>(), f, factor, a.data<T>(),
                          total.defined() ? total.data<T>() : nullptr);
  });
  if (autograd::needs_grad({&x, &s})) {
    auto node = std::make_unique<ClusterAffinitiesFusedNode>();
    node->x = x, node->s = s, node->a = a, node->total = total, node->f = f;
    node->outputs = {a};
    autograd::record(std::move(node));
  }
  return a;
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath cluster_affinities_fused_path() {
  return fast_path<ClusterAffinitiesInputs>(
      "cluster_affinities_fused", __FILE__, "CPU f32/f64, softmax and Laplace rows", cpu_float,
      [](const ClusterAffinitiesInputs& in) { return cluster_affinities_fused(in.x, in.s, in.f); });
}

}  // namespace cast::ops
