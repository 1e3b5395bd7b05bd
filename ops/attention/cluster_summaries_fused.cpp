#include <memory>
#include <vector>

#include "autograd/tape.h"
#include "ops/dispatch.h"
#include "ops/attention/fast_paths.h"
#include "ops/matmul.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/cluster_summaries_fused.h"
#endif

// CAST step 6: the reference (ops/attention/cluster_summaries.cpp) forms W = A_k ⊙ m, its column sums and
// P = W / Σ W in five or six passes over (B, H, N, C); here each column is summed in one pass
// and P written normalised in a second, and the backward likewise (cuda/attention/cluster_summaries_fused.cu on the
// GPU; below, one thread per (batch, head) group on the CPU). R_inter = Pᵀ V and dV = P dR stay
// products.
namespace cast::ops {

namespace {

// colsum (BH, C) = Σ_i A_k[i,c] m_i + 1e-30, then P = A_k m / colsum; the mask row of group bh
// is bh / heads
template <class T>
void weights_forward_cpu(T* p, T* colsum, const T* a_k, const T* mask, int64_t BH, int64_t N, int64_t C,
                         int64_t heads) {
#pragma omp parallel for if (BH > 1 && BH * N * C > 65536)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const T* a = a_k + bh * N * C;
    const T* m = mask ? mask + (bh / heads) * N : nullptr;
    T* sum = colsum + bh * C;
    for (int64_t c = 0; c < C; ++c) sum[c] = T(0);
    for (int64_t i = 0; i < N; ++i) {
      const T mi = m ? m[i] : T(1);
      for (int64_t c = 0; c < C; ++c) sum[c] += a[i * C + c] * mi;
    }
    for (int64_t c = 0; c < C; ++c) sum[c] += T(1e-30);
    for (int64_t i = 0; i < N; ++i) {
      const T mi = m ? m[i] : T(1);
      for (int64_t c = 0; c < C; ++c) p[(bh * N + i) * C + c] = a[i * C + c] * mi / sum[c];
    }
  }
}

// dA_k[i,c] += m_i (dP[i,c] − Σ_j P[j,c] dP[j,c]) / colsum[c]
template <class T>
void weights_backward_cpu(T* da_k, const T* dp, const T* p, const T* colsum, const T* mask, int64_t BH, int64_t N,
                          int64_t C, int64_t heads) {
#pragma omp parallel for if (BH > 1 && BH * N * C > 65536)
  for (int64_t bh = 0; bh < BH; ++bh) {
    const T *g = dp + bh * N * C, *pr = p + bh * N * C, *sum = colsum + bh * C;
    const T* m = mask ? mask + (bh / heads) * N : nullptr;
    std::vector<T> dot(C, T(0));
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = 0; c < C; ++c) dot[c] += g[i * C + c] * pr[i * C + c];
    for (int64_t i = 0; i < N; ++i) {
      const T mi = m ? m[i] : T(1);
      T* da = da_k + (bh * N + i) * C;
      // (g − dot) / Σ first, then the mask, as the reference: a padded token of a cluster whose
      // quotient overflows gets inf · 0 = NaN there too
      for (int64_t c = 0; c < C; ++c) da[c] += (g[i * C + c] - dot[c]) / sum[c] * mi;
    }
  }
}

void weights_forward(Tensor& p, Tensor& colsum, const Tensor& a_k, const Tensor* mask, int64_t heads) {
  CAST_ON_CUDA(a_k, cuda::summary_weights_forward(p, colsum, a_k, mask, heads));
  CAST_DISPATCH_FLOAT(a_k.dtype(), "cluster_summaries_fused", [&] {
    weights_forward_cpu<T>(p.data<T>(), colsum.data<T>(), a_k.data<T>(), mask ? mask->data<T>() : nullptr, a_k.dim(0),
                           a_k.dim(1), a_k.dim(2), heads);
  });
}

void weights_backward(Tensor& da_k, const Tensor& dp, const Tensor& p, const Tensor& colsum, const Tensor* mask,
                      int64_t heads) {
  CAST_ON_CUDA(p, cuda::summary_weights_backward(da_k, dp, p, colsum, mask, heads));
  CAST_DISPATCH_FLOAT(p.dtype(), "cluster_summaries_fused", [&] {
    weights_backward_cpu<T>(da_k.data<T>(), dp.data<T>(), p.data<T>(), colsum.data<T>(),
                            mask ? mask->data<T>() : nullptr, p.dim(0), p.dim(1), p.dim(2), heads);
  });
}

// P = W / Σ W (B, H, N, C) and its column sums (B·H, C) from A_k and the mask.
void summary_weights(Tensor& p, Tensor& colsum, const Tensor& a_k, const Tensor& mask) {
  const int64_t B = a_k.dim(0), H = a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
  p = Tensor::empty(a_k.shape(), a_k.dtype(), a_k.device());
  colsum = Tensor::empty({B * H, C}, a_k.dtype(), a_k.device());
  Tensor p3 = p.view({B * H, N, C});
  weights_forward(p3, colsum, a_k.view({B * H, N, C}), mask.defined() ? &mask : nullptr, H);
}

// P is not kept from the forward: the backward forms it again from A_k (held as an input anyway)
// in the same two passes, bit for bit, rather than hold a token × cluster matrix from the
// forward to the backward.
struct SummariesFusedNode final : autograd::Node {
  Tensor a_k, v;  // inputs (B, H, N, C), (B, H, N, d)
  Tensor mask;    // (B, N) or undefined
  const char* name() const override { return "cluster_summaries_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("a_k", a_k);
    visit.input("v", v);
    visit.input("mask", mask);
  }
  void backward() override {
    const Tensor& dr = outputs[0].grad();  // (B, H, C, d)
    Tensor p, colsum;
    summary_weights(p, colsum, a_k, mask);
    if (v.requires_grad()) {
      bool fresh = false;  // a first gradient is written by the product, not added to zeros
      Tensor dv = v.grad_buffer(&fresh);
      gemm(dv, p, dr, false, false, 1.0, fresh ? 0.0 : 1.0, matmul_shape(p, dr, false, false));  // dV (+)= P dR
    }
    if (!a_k.requires_grad()) return;
    const int64_t BH = a_k.dim(0) * a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
    Tensor dp = Tensor::empty(p.shape(), p.dtype(), p.device());
    gemm(dp, v, dr, false, true, 1.0, 0.0, matmul_shape(v, dr, false, true));  // dP = V dRᵀ
    Tensor da = a_k.grad_accumulator().view({BH, N, C});
    weights_backward(da, dp.view({BH, N, C}), p.view({BH, N, C}), colsum, mask.defined() ? &mask : nullptr, a_k.dim(1));
  }
};
}  // namespace

Tensor cluster_summaries_fused(const Tensor& a_k, const Tensor& v, const Tensor& mask) {
  const char* op = "cluster_summaries_fused";
  check_ndim(op, a_k, 4, "a_k");
  check_ndim(op, v, 4, "v");
  check_same_device(op, a_k, v);
  check_float(op, a_k, "a_k");
  check_same_dtype(op, a_k, v);
  CAST_CHECK(!a_k.is_cuda() || a_k.dtype() == DType::f32, "{}: the CUDA kernel is f32, got a_k {}", op, a_k.describe());
  const int64_t B = a_k.dim(0), H = a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
  CAST_CHECK(v.dim(0) == B && v.dim(1) == H && v.dim(2) == N, "{}: v {} does not fit a_k {}", op, v.describe(),
             a_k.describe());
  if (mask.defined()) {
    check_same_device(op, a_k, mask);
    check_same_dtype(op, a_k, mask);
    CAST_CHECK(mask.shape() == (Shape{B, N}), "{}: mask {} must be [{}, {}]", op, mask.describe(), B, N);
  }
  Tensor p, colsum;
  summary_weights(p, colsum, a_k, mask);
  Tensor r = Tensor::empty({B, H, C, v.dim(3)}, v.dtype(), v.device());
  gemm(r, p, v, true, false, 1.0, 0.0, matmul_shape(p, v, true, false));  // R_inter = Pᵀ V
  if (autograd::needs_grad({&a_k, &v})) {
    auto node = std::make_unique<SummariesFusedNode>();
    node->a_k = a_k, node->v = v, node->mask = mask;
    node->outputs = {r};
    autograd::record(std::move(node));
  }
  return r;
}

// ---------------------------------------------------------------- its row of the fast-path table
static bool summaries_fits(const StepSizes& s) { return cpu_float(s) || cuda_f32(s); }

FastPath cluster_summaries_fused_path() {
  return fast_path<ClusterSummariesInputs>(
      "cluster_summaries_fused", __FILE__, "CPU f32/f64; CUDA f32", summaries_fits,
      [](const ClusterSummariesInputs& in) { return cluster_summaries_fused(in.a_k, in.v, in.mask); });
}

}  // namespace cast::ops
