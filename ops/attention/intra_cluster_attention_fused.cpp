#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/attention/fused_rows.h"
#include "ops/matmul.h"
#include "ops/rows.h"

// CAST step 5, intra-cluster attention, fused on the CPU: for each cluster its κ member rows of
// Q, K and V are gathered into a tile that stays in cache, the κ × κ scores and their softmax
// live only there, and the backward recomputes them from the saved row log-sum-exp. The
// reference (ops/attention/intra_cluster_attention.cpp) stores the gathered rows and the B·H·C·κ² probabilities.
namespace cast::ops {

namespace {
using namespace fused_rows;

// ---------------------------------------------------------------- intra-cluster attention
struct IntraShape {
  int64_t BH, N, C, kappa, d;
};

template <class T>
void intra_forward(const IntraShape& s, const T* q, const T* k, const T* v, const int32_t* members, T* out, T* lse) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const int64_t K = s.kappa, d = s.d;
#pragma omp parallel if (s.BH * s.C > 1)
  {
    std::vector<T> qc(K * d), kc(K * d), vc(K * d), p(K * K);
#pragma omp for schedule(dynamic, 4)
    for (int64_t cluster = 0; cluster < s.BH * s.C; ++cluster) {  // cluster = bh·C + c
      const int64_t bh = cluster / s.C;
      const int32_t* ids = members + cluster * K;
      gather(qc.data(), q + bh * s.N * d, ids, K, d);
      gather(kc.data(), k + bh * s.N * d, ids, K, d);
      gather(vc.data(), v + bh * s.N * d, ids, K, d);
      gemm_tile<T>(p.data(), qc.data(), kc.data(), false, true, scale, T(0), K, K, d);  // S = Qc Kcᵀ/√d
      softmax_rows(p.data(), ids, K, K, lse + cluster * K);                             // P over filled slots
      gemm_tile<T>(out + cluster * K * d, p.data(), vc.data(), false, false, T(1), T(0), K, d, K);  // P Vc
    }
  }
}

template <class T>
void intra_backward(const IntraShape& s, const T* q, const T* k, const T* v, const int32_t* members, const T* lse,
                    const T* dout, T* dq, T* dk, T* dv) {
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.d)));
  const int64_t K = s.kappa, d = s.d;
  // A token may sit in several clusters of its head: one thread owns each head's gradients.
#pragma omp parallel if (s.BH > 1)
  {
    std::vector<T> qc(K * d), kc(K * d), vc(K * d), p(K * K), dp(K * K), rows(K * d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < s.BH; ++bh) {
      for (int64_t c = 0; c < s.C; ++c) {
        const int64_t cluster = bh * s.C + c;
        const int32_t* ids = members + cluster * K;
        const T* dout_c = dout + cluster * K * d;  // (κ, d)
        gather(qc.data(), q + bh * s.N * d, ids, K, d);
        gather(kc.data(), k + bh * s.N * d, ids, K, d);
        gather(vc.data(), v + bh * s.N * d, ids, K, d);
        gemm_tile<T>(p.data(), qc.data(), kc.data(), false, true, scale, T(0), K, K, d);
        probabilities_from_lse(p.data(), ids, K, K, lse + cluster * K);
        if (dv) {  // dVc = Pᵀ dO
          gemm_tile<T>(rows.data(), p.data(), dout_c, true, false, T(1), T(0), K, d, K);
          scatter_add(dv + bh * s.N * d, rows.data(), ids, K, d);
        }
        if (!dq && !dk) continue;
        gemm_tile<T>(dp.data(), dout_c, vc.data(), false, true, T(1), T(0), K, K, d);  // dP = dO Vcᵀ
        softmax_grad_rows(dp.data(), p.data(), K, K);                                  // dS
        if (dq) {                                                                      // dQc = dS Kc/√d
          gemm_tile<T>(rows.data(), dp.data(), kc.data(), false, false, scale, T(0), K, d, K);
          scatter_add(dq + bh * s.N * d, rows.data(), ids, K, d);
        }
        if (dk) {  // dKc = dSᵀ Qc/√d
          gemm_tile<T>(rows.data(), dp.data(), qc.data(), true, false, scale, T(0), K, d, K);
          scatter_add(dk + bh * s.N * d, rows.data(), ids, K, d);
        }
      }
    }
  }
}

struct IntraClusterFusedNode final : autograd::Node {
  Tensor q, k, v;  // inputs (B, H, N, d)
  Tensor members;  // (B, H, C, κ) i32
  Tensor lse;      // saved row log-sum-exp of each slot's softmax: (B, H, C, κ)
  const char* name() const override { return "intra_cluster_attention_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("members", members);
    visit.saved("lse", lse);
  }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    const IntraShape s{q.dim(0) * q.dim(1), q.dim(2), members.dim(2), members.dim(3), q.dim(3)};
    CAST_DISPATCH_FLOAT(q.dtype(), "intra_cluster_attention_fused", [&] {
      auto ptr = [](Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
      intra_backward<T>(s, q.data<T>(), k.data<T>(), v.data<T>(), members.data<int32_t>(), lse.data<T>(),
                        outputs[0].grad().data<T>(), ptr(dq), ptr(dk), ptr(dv));
    });
  }
};

}  // namespace

Tensor intra_cluster_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& members) {
  const char* op = "intra_cluster_attention_fused";
  check_intra_cluster_inputs(op, q, k, v, members);
  CAST_CHECK(!q.is_cuda(), "{}: a CPU kernel, got q {} (the GPU's is intra_cluster_attention_flash)", op, q.describe());
  const IntraShape s{q.dim(0) * q.dim(1), q.dim(2), members.dim(2), members.dim(3), q.dim(3)};
  Tensor out = Tensor::empty({q.dim(0), q.dim(1), s.C, s.kappa, s.d}, q.dtype());
  Tensor lse = Tensor::empty({q.dim(0), q.dim(1), s.C, s.kappa}, q.dtype());
  CAST_DISPATCH_FLOAT(q.dtype(), op, [&] {
    intra_forward<T>(s, q.data<T>(), k.data<T>(), v.data<T>(), members.data<int32_t>(), out.data<T>(), lse.data<T>());
  });
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<IntraClusterFusedNode>();
    node->q = q, node->k = k, node->v = v, node->members = members, node->lse = lse;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- its row of the fast-path table
FastPath intra_cluster_attention_fused_path() {
  return fast_path<IntraClusterAttentionInputs>("intra_cluster_attention_fused", __FILE__, "CPU f32/f64", cpu_float,
                                                [](const IntraClusterAttentionInputs& in) {
                                                  return intra_cluster_attention_fused(in.q, in.k, in.v, in.members);
                                                });
}

}  // namespace cast::ops
