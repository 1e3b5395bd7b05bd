#include <algorithm>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/unary_cpu.h"

// CAST step 3 fused on the CPU: g = sigmoid(X W_φ + b_φ) and A_g = A_k + g ⊙ (A_q − A_k) in one
// pass over the rows. The reference (ops/attention/gated_affinity.cpp) records the gate as six primitive ops
// (a BLAS product only G columns wide, the bias, the sigmoid, a permute and reshapes) and keeps
// A_q − A_k, a (B, G, N, C) tensor, for its backward. Here each task computes the gate of its
// rows with one dot product per (token, group) and mixes the rows at once; the backward reads
// A_q and A_k again and keeps nothing but g, (B, N, G).
namespace cast::ops {

namespace {

struct GateShape {
  int64_t B, N, D, G, C;
};
constexpr int64_t kRows = 256;  // rows of a task; the backward sums dW_φ per task and adds the tasks in order

// g (B, N, G) = sigmoid(x W + b) over rows [r0, r0 + rows) of batch row b; a_g's rows mixed
template <class T>
void gate_forward_rows(const GateShape& s, const T* x, const T* wt, const T* bias, const T* a_q, const T* a_k, T* g,
                       T* a_g, int64_t b, int64_t r0, int64_t rows) {
  for (int64_t i = r0; i < r0 + rows; ++i) {
    const T* xi = x + (b * s.N + i) * s.D;
    for (int64_t j = 0; j < s.G; ++j) {
      const T* wj = wt + j * s.D;
      T z = 0;
#pragma omp simd reduction(+ : z)
      for (int64_t e = 0; e < s.D; ++e) z += xi[e] * wj[e];
      g[(b * s.N + i) * s.G + j] = unary_cpu::apply_cpu<UnaryOp::sigmoid, T>(z + bias[j]);
    }
  }
  for (int64_t j = 0; j < s.G; ++j)
    for (int64_t i = r0; i < r0 + rows; ++i) {
      const int64_t row = ((b * s.G + j) * s.N + i) * s.C;
      const T gi = g[(b * s.N + i) * s.G + j];
      const T *q = a_q + row, *k = a_k + row;
      T* out = a_g + row;
#pragma omp simd
      for (int64_t c = 0; c < s.C; ++c) out[c] = k[c] + gi * (q[c] - k[c]);
    }
}

// W_φ (D, G) transposed: each group's column a contiguous row, for the loops over D
template <class T>
std::vector<T> transposed(const T* w, int64_t D, int64_t G) {
  std::vector<T> wt(G * D);
  for (int64_t e = 0; e < D; ++e)
    for (int64_t j = 0; j < G; ++j) wt[j * D + e] = w[e * G + j];
  return wt;
}

template <class T>
void gate_forward(const GateShape& s, const T* x, const T* w, const T* bias, const T* a_q, const T* a_k, T* g, T* a_g) {
  const std::vector<T> wt = transposed(w, s.D, s.G);
  const int64_t blocks = (s.N + kRows - 1) / kRows;
  CAST_OMP("omp parallel for schedule(static) if (s.B * s.N * s.G * (s.C + s.D) > 65536)")
  for (int64_t task = 0; task < s.B * blocks; ++task) {
    const int64_t b = task / blocks, r0 = (task % blocks) * kRows;
    gate_forward_rows<T>(s, x, wt.data(), bias, a_q, a_k, g, a_g, b, r0, std::min(kRows, s.N - r0));
  }
}

// dA_q += g dA_g, dA_k += (1 − g) dA_g, dz = Σ_c dA_g (A_q − A_k) · g (1 − g), then dx += dz W_φᵀ
// and, per task, dW_φ = Σ xᵀ dz and db_φ = Σ dz.
template <class T>
void gate_backward(const GateShape& s, const T* x, const T* wt, const T* a_q, const T* a_k, const T* g, const T* da,
                   T* dx, T* dw, T* db, T* da_q, T* da_k) {
  const int64_t blocks = (s.N + kRows - 1) / kRows, tasks = s.B * blocks;
  const bool gate = dx || dw || db;
  std::vector<T> partial(gate ? tasks * (s.D + 1) * s.G : 0, T(0));  // per task: dW_φ (D, G), then db_φ (G)
  CAST_OMP("omp parallel if (s.B * s.N * s.G * (s.C + s.D) > 65536)")
  {
    std::vector<T> dz(kRows * s.G);
    CAST_OMP("omp for schedule(static)")
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / blocks, r0 = (task % blocks) * kRows, rows = std::min(kRows, s.N - r0);
      for (int64_t j = 0; j < s.G; ++j)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = r0 + r, row = ((b * s.G + j) * s.N + i) * s.C;
          const T gi = g[(b * s.N + i) * s.G + j];
          const T *q = a_q + row, *k = a_k + row, *d = da + row;
          T dg = 0;
#pragma omp simd reduction(+ : dg)
          for (int64_t c = 0; c < s.C; ++c) dg += d[c] * (q[c] - k[c]);
          dz[r * s.G + j] = dg * unary_derivative(UnaryOp::sigmoid, T(0), gi);
          if (da_q) {
            T* out = da_q + row;
#pragma omp simd
            for (int64_t c = 0; c < s.C; ++c) out[c] += d[c] * gi;
          }
          if (da_k) {
            T* out = da_k + row;
            const T rest = T(1) - gi;
#pragma omp simd
            for (int64_t c = 0; c < s.C; ++c) out[c] += d[c] * rest;
          }
        }
      if (!gate) continue;
      T* pw = partial.data() + task * (s.D + 1) * s.G;  // dW_φᵀ (G, D), then db_φ (G)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xi = x + (b * s.N + r0 + r) * s.D;
        T* dxi = dx ? dx + (b * s.N + r0 + r) * s.D : nullptr;
        for (int64_t j = 0; j < s.G; ++j) {
          const T dzj = dz[r * s.G + j];
          const T* wj = wt + j * s.D;
          T* pj = pw + j * s.D;
          if (dxi) {
#pragma omp simd
            for (int64_t e = 0; e < s.D; ++e) dxi[e] += dzj * wj[e];
          }
#pragma omp simd
          for (int64_t e = 0; e < s.D; ++e) pj[e] += xi[e] * dzj;
          pw[s.D * s.G + j] += dzj;
        }
      }
    }
  }
  for (int64_t task = 0; task < tasks && gate; ++task) {  // in order, whatever the number of threads
    const T* pw = partial.data() + task * (s.D + 1) * s.G;
    if (dw)
      for (int64_t e = 0; e < s.D; ++e)
        for (int64_t j = 0; j < s.G; ++j) dw[e * s.G + j] += pw[j * s.D + e];
    if (db)
      for (int64_t j = 0; j < s.G; ++j) db[j] += pw[s.D * s.G + j];
  }
}

GateShape shape_of(const Tensor& x, const Tensor& a_q) {
  return {x.dim(0), x.dim(1), x.dim(2), a_q.dim(1), a_q.dim(3)};
}

struct GatedAffinityFusedNode final : autograd::Node {
  Tensor x, gate_w, gate_b;  // inputs (B, N, D), (D, G), (G)
  Tensor a_q, a_k;           // inputs (B, G, N, C)
  Tensor g;                  // saved gate (B, N, G)
  const char* name() const override { return "gated_affinity_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("x", x);
    visit.input("gate_w", gate_w);
    visit.input("gate_b", gate_b);
    visit.input("a_q", a_q);
    visit.input("a_k", a_k);
    visit.saved("g", g);
  }
  void backward() override {
    auto grad = [](Tensor& t) { return t.requires_grad() ? t.grad_accumulator() : Tensor(); };
    Tensor dx = grad(x), dw = grad(gate_w), db = grad(gate_b), da_q = grad(a_q), da_k = grad(a_k);
    CAST_DISPATCH_FLOAT(x.dtype(), "gated_affinity_fused", [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      const GateShape sh = shape_of(x, a_q);
      gate_backward<T>(sh, x.data<T>(), transposed(gate_w.data<T>(), sh.D, sh.G).data(), a_q.data<T>(), a_k.data<T>(),
                       g.data<T>(), outputs[0].grad().data<T>(), ptr(dx), ptr(dw), ptr(db), ptr(da_q), ptr(da_k));
    });
  }
};

}  // namespace

Tensor gated_affinity_fused(const Tensor& x, const Tensor& gate_w, const Tensor& gate_b, const Tensor& a_q,
                            const Tensor& a_k) {
  const char* op = "gated_affinity_fused";
  check_gated_affinity_inputs(op, x, gate_w, gate_b, a_q, a_k);
  CAST_CHECK(!x.is_cuda(), "{}: a CPU kernel, got x {}", op, x.describe());
  const GateShape s = shape_of(x, a_q);
  Tensor g = Tensor::empty({s.B, s.N, s.G}, x.dtype());
  Tensor a_g = Tensor::empty(a_q.shape(), x.dtype());
  CAST_DISPATCH_FLOAT(x.dtype(), op, [&] {
    gate_forward<T>(s, x.data<T>(), gate_w.data<T>(), gate_b.data<T>(), a_q.data<T>(), a_k.data<T>(), g.data<T>(),
                    a_g.data<T>());
  });
  if (autograd::needs_grad({&x, &gate_w, &gate_b, &a_q, &a_k})) {
    auto node = std::make_unique<GatedAffinityFusedNode>();
    node->x = x, node->gate_w = gate_w, node->gate_b = gate_b, node->a_q = a_q, node->a_k = a_k, node->g = g;
    node->outputs = {a_g};
    autograd::record(std::move(node));
  }
  return a_g;
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath gated_affinity_fused_path() {
  return fast_path<GatedAffinityInputs>(
      "gated_affinity_fused", __FILE__, "CPU f32/f64", cpu_float,
      [](const GatedAffinityInputs& in) { return gated_affinity_fused(in.x, in.gate_w, in.gate_b, in.a_q, in.a_k); });
}

}  // namespace cast::ops
