// The flash tiles on one thread: libxsmm's JIT kernels against cpu/gemm_tile.cpp and OpenBLAS,
// interleaved, best of 7 batches each; how the tile kernel was chosen (bench/RESULTS.md).
// Row-major C (m x n) += A (m x k) op(B); libxsmm is column-major, so it computes
// C^T += op(B)^T A^T. Not part of the build: libxsmm is no dependency of cast.
//   apt-get install libxsmm-dev
//   g++ -O3 -march=native -std=gnu++20 -fno-trapping-math -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp \
//       bench/tile_compare.cpp cpu/gemm_tile.cpp -o /tmp/tile_compare \
//       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lxsmm -lxsmmext -lxsmmnoblas -fopenmp -ldl -lpthread
//   OMP_NUM_THREADS=1 /tmp/tile_compare
#include <cblas.h>
#include <libxsmm.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "cpu/gemm_tile.h"
struct S {
  int m, n, k;
  bool tb;
  const char* what;
};
int main() {
  openblas_set_num_threads(1);
  libxsmm_init();
  S shapes[] = {{64, 64, 128, false, "O += P V (NN)"},
                {64, 128, 64, true, "S = Q K^T (NT)"},
                {48, 16, 48, false, "small PV (N 48, d 16)"}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto s : shapes) {
    std::vector<float> a(s.m * s.k), b(s.k * s.n), c0(s.m * s.n), c1, c2, c3;
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = nd(rng);
    for (auto& x : c0) x = nd(rng);
    c1 = c2 = c3 = c0;
    libxsmm_blasint m = s.n, n = s.m, k = s.k, lda = s.tb ? s.k : s.n, ldb = s.k, ldc = s.n;
    float alpha = 1, beta = 1;
    int flags = s.tb ? LIBXSMM_GEMM_FLAG_TRANS_A : LIBXSMM_GEMM_FLAG_NONE;
    libxsmm_smmfunction kernel = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
    auto run_x = [&] { kernel(b.data(), a.data(), c1.data()); };
    auto run_t = [&] {
      cast::ops::gemm_tile_kernel(c2.data(), a.data(), b.data(), false, s.tb, 1.f, 1.f, s.m, s.n, s.k);
    };
    auto run_b = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.f, a.data(), s.k,
                  b.data(), s.tb ? s.k : s.n, 1.f, c3.data(), s.n);
    };
    if (!kernel) {
      printf("%-24s libxsmm: no JIT kernel for this case (flags %d)\n", s.what, flags);
    } else {
      run_x();
      run_b();
      double e = 0;
      for (int i = 0; i < s.m * s.n; ++i) e = std::max(e, (double)std::fabs(c1[i] - c3[i]));
      printf("%-24s libxsmm vs openblas max|diff| %.1e\n", s.what, e);
    }
    const int reps = 40000000 / (s.m * s.n * s.k) + 1;
    double best[3] = {1e9, 1e9, 1e9};
    for (int round = 0; round < 7; ++round)
      for (int w = 0; w < 3; ++w) {
        if (w == 0 && !kernel) continue;
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) {
          if (w == 0) run_x();
          else if (w == 1) run_t();
          else run_b();
        }
        best[w] =
            std::min(best[w], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
    auto gf = [&](double t) { return 2.0 * s.m * s.n * s.k / t / 1e9; };
    std::vector<float> packed(cast::ops::packed_floats(s.n, s.k));
    cast::ops::pack_b(packed.data(), b.data(), s.tb, s.n, s.k);
    double bp = 1e9;
    for (int round = 0; round < 7; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r)
        cast::ops::gemm_tile_packed(c2.data(), a.data(), false, packed.data(), 1.f, 1.f, s.m, s.n, s.k);
      bp = std::min(bp, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    printf("%-24s gemm_tile with op(b) packed beforehand (TileOperand): %.1f GFLOP/s\n", s.what, gf(bp));
    printf("%-24s %dx%dx%d  libxsmm %.1f  gemm_tile %.1f  openblas %.1f GFLOP/s\n", s.what, s.m, s.n, s.k,
           kernel ? gf(best[0]) : 0.0, gf(best[1]), gf(best[2]));
  }
}
