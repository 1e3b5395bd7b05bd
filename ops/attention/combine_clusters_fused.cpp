#include <memory>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/matmul.h"
#include "ops/rows.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/combine_clusters_fused.h"
#endif

// CAST step 7: O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c]).
// The dense part stays a product; the sparse part writes each slot's weighted difference
// straight into its token's row, so the reference's (B·H, C, κ, d) differences and products
// (ops/attention/combine_clusters.cpp) are never stored. Its backward walks each cluster's slots once. On the
// GPU (cuda/attention/combine_clusters_fused.cu) a block per cluster with one writer per dW entry; on the CPU a thread
// per (batch, head) group, which owns every row its slots write.
namespace cast::ops {

namespace {

// out (BH, N, d) += Σ over slots of W[i,c] (R_intra[c][p] − R_inter[c]); inter may be null
template <class T>
void sparse_forward_cpu(T* out, const T* w, const T* intra, const T* inter, const int32_t* members, int64_t BH,
                        int64_t N, int64_t C, int64_t kappa, int64_t d) {
#pragma omp parallel for if (BH > 1 && BH * C * kappa * d > 32768)
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < kappa; ++p) {
        const int64_t slot = (bh * C + c) * kappa + p, i = members[slot];
        if (i < 0 || i >= N) continue;  // an empty slot (a bad id is refused by the op's check)
        const T wi = w[(bh * N + i) * C + c];
        const T* r = intra + slot * d;
        const T* r0 = inter ? inter + (bh * C + c) * d : nullptr;
        T* o = out + (bh * N + i) * d;
        if (r0) {
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) o[e] += wi * (r[e] - r0[e]);
        } else {
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) o[e] += wi * r[e];
        }
      }
}

// The sparse part's gradients, added: dW[i,c] += dO_i · (R_intra[c][p] − R_inter[c]),
// dR_intra[c][p] += W[i,c] dO_i, dR_inter[c] −= Σ_p W[i,c] dO_i. Any of them may be null.
template <class T>
void sparse_backward_cpu(T* dw, T* dintra, T* dinter, const T* dout, const T* w, const T* intra, const T* inter,
                         const int32_t* members, int64_t BH, int64_t N, int64_t C, int64_t kappa, int64_t d) {
#pragma omp parallel for if (BH > 1 && BH * C * kappa * d > 32768)
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t c = 0; c < C; ++c) {
      const T* r0 = inter ? inter + (bh * C + c) * d : nullptr;
      T* dr0 = dinter ? dinter + (bh * C + c) * d : nullptr;
      for (int64_t p = 0; p < kappa; ++p) {
        const int64_t slot = (bh * C + c) * kappa + p, i = members[slot];
        if (i < 0 || i >= N) continue;
        const T wi = w[(bh * N + i) * C + c];
        const T* g = dout + (bh * N + i) * d;
        const T* r = intra + slot * d;
        if (dw) {  // a vector sum: the scalar chain of adds waited on each add's latency
          T part = 0;
          if (r0) {
#pragma omp simd reduction(+ : part)
            for (int64_t e = 0; e < d; ++e) part += g[e] * (r[e] - r0[e]);
          } else {
#pragma omp simd reduction(+ : part)
            for (int64_t e = 0; e < d; ++e) part += g[e] * r[e];
          }
          dw[(bh * N + i) * C + c] += part;
        }
        if (dintra) {
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) dintra[slot * d + e] += wi * g[e];
        }
        if (dr0) {
#pragma omp simd
          for (int64_t e = 0; e < d; ++e) dr0[e] -= wi * g[e];
        }
      }
    }
}

void sparse_forward(Tensor& out, const Tensor& w, const Tensor& intra, const Tensor* inter, const Tensor& members) {
  CAST_ON_CUDA(w, cuda::combine_sparse_forward(out, w, intra, inter, members));
  const int64_t BH = w.dim(0), N = w.dim(1), C = w.dim(2), kappa = members.dim(1) / C, d = intra.dim(-1);
  CAST_DISPATCH_FLOAT(w.dtype(), "combine_clusters_fused", [&] {
    sparse_forward_cpu<T>(out.data<T>(), w.data<T>(), intra.data<T>(), inter ? inter->data<T>() : nullptr,
                          members.data<int32_t>(), BH, N, C, kappa, d);
  });
}

void sparse_backward(Tensor* dw, Tensor* dintra, Tensor* dinter, const Tensor& dout, const Tensor& w,
                     const Tensor& intra, const Tensor* inter, const Tensor& members) {
  CAST_ON_CUDA(w, cuda::combine_sparse_backward(dw, dintra, dinter, dout, w, intra, inter, members));
  const int64_t BH = w.dim(0), N = w.dim(1), C = w.dim(2), kappa = members.dim(1) / C, d = intra.dim(-1);
  CAST_DISPATCH_FLOAT(w.dtype(), "combine_clusters_fused", [&] {
    auto ptr = [](Tensor* t) { return t ? t->data<T>() : nullptr; };
    sparse_backward_cpu<T>(ptr(dw), ptr(dintra), ptr(dinter), dout.data<T>(), w.data<T>(), intra.data<T>(),
                           inter ? inter->data<T>() : nullptr, members.data<int32_t>(), BH, N, C, kappa, d);
  });
}

struct CombineFusedNode final : autograd::Node {
  Tensor w, r_intra, r_inter;  // inputs; r_inter undefined with summaries off
  Tensor members;              // (B·H, C·κ) token per slot
  const char* name() const override { return "combine_clusters_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("w", w);
    visit.input("r_intra", r_intra);
    visit.input("r_inter", r_inter);
    visit.input("members", members);
  }
  void backward() override {
    const int64_t BH = members.dim(0), N = w.dim(2), C = w.dim(3), kappa = r_intra.dim(3), d = r_intra.dim(4);
    const Tensor& dout = outputs[0].grad();  // (B, H, N, d)
    bool fresh = false;                      // a first gradient is written by the product, not added to zeros
    if (r_inter.defined() && w.requires_grad()) {
      Tensor dw = w.grad_buffer(&fresh);
      gemm(dw, dout, r_inter, false, true, 1.0, fresh ? 0.0 : 1.0,
           matmul_shape(dout, r_inter, false, true));  // dO R_interᵀ
    }
    if (r_inter.defined() && r_inter.requires_grad()) {
      Tensor dr = r_inter.grad_buffer(&fresh);
      gemm(dr, w, dout, true, false, 1.0, fresh ? 0.0 : 1.0, matmul_shape(w, dout, true, false));  // Wᵀ dO
    }
    Tensor dw = w.requires_grad() ? w.grad_accumulator().view({BH, N, C}) : Tensor();
    Tensor dintra = r_intra.requires_grad() ? r_intra.grad_accumulator().view({BH, C, kappa, d}) : Tensor();
    Tensor dinter =
        r_inter.defined() && r_inter.requires_grad() ? r_inter.grad_accumulator().view({BH, C, d}) : Tensor();
    const Tensor inter = r_inter.defined() ? r_inter.view({BH, C, d}) : Tensor();
    sparse_backward(dw.defined() ? &dw : nullptr, dintra.defined() ? &dintra : nullptr,
                    dinter.defined() ? &dinter : nullptr, dout.view({BH, N, d}), w.view({BH, N, C}),
                    r_intra.view({BH, C, kappa, d}), inter.defined() ? &inter : nullptr, members);
  }
};
}  // namespace

Tensor combine_clusters_fused(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members) {
  const char* op = "combine_clusters_fused";
  check_ndim(op, w, 4, "w");
  check_ndim(op, r_intra, 5, "r_intra");
  check_ndim(op, members, 4, "members");
  check_dtype(op, members, DType::i32, "members");
  check_same_device(op, w, r_intra);
  check_same_device(op, w, members);
  check_float(op, w, "w");
  check_same_dtype(op, w, r_intra);
  CAST_CHECK(!w.is_cuda() || w.dtype() == DType::f32, "{}: the CUDA kernel is f32, got w {}", op, w.describe());
  const int64_t B = w.dim(0), H = w.dim(1), N = w.dim(2), C = w.dim(3);
  const int64_t kappa = members.dim(3), d = r_intra.dim(4), BH = B * H;
  CAST_CHECK(r_intra.shape() == (Shape{B, H, C, kappa, d}) && members.shape() == (Shape{B, H, C, kappa}),
             "{}: r_intra {} and members {} do not fit w {}", op, r_intra.describe(), members.describe(), w.describe());
  if (r_inter.defined()) {
    check_same_device(op, w, r_inter);
    check_same_dtype(op, w, r_inter);
    CAST_CHECK(r_inter.shape() == (Shape{B, H, C, d}), "{}: r_inter {} must be [{}, {}, {}, {}]", op,
               r_inter.describe(), B, H, C, d);
  }
  Tensor idx = members.view({BH, C * kappa});
  check_index_range(op, idx, -1, N);
  Tensor out = Tensor::zeros({B, H, N, d}, w.dtype(), w.device());
  if (r_inter.defined()) gemm(out, w, r_inter, false, false, 1.0, 0.0, matmul_shape(w, r_inter, false, false));
  Tensor out3 = out.view({BH, N, d});
  const Tensor inter = r_inter.defined() ? r_inter.view({BH, C, d}) : Tensor();
  sparse_forward(out3, w.view({BH, N, C}), r_intra.view({BH, C, kappa, d}), inter.defined() ? &inter : nullptr, idx);
  if (autograd::needs_grad({&w, &r_intra, &r_inter})) {
    auto node = std::make_unique<CombineFusedNode>();
    node->w = w, node->r_intra = r_intra, node->r_inter = r_inter, node->members = idx;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}

// ---------------------------------------------------------------- its row of the fast-path table
static bool combine_fits(const StepSizes& s) {
#ifdef CAST_WITH_CUDA
  return cpu_float(s) || (cuda_f32(s) && s.head_width <= cuda::kCombineMaxHead);
#else
  return cpu_float(s);
#endif
}

FastPath combine_clusters_fused_path() {
  return fast_path<CombineClustersInputs>(
      "combine_clusters_fused", __FILE__, "CPU f32/f64; CUDA f32 with head width up to 128", combine_fits,
      [](const CombineClustersInputs& in) { return combine_clusters_fused(in.w, in.r_intra, in.r_inter, in.members); });
}

}  // namespace cast::ops
