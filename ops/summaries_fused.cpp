#include <memory>

#include "autograd/tape.h"
#include "ops/fast.h"
#include "ops/matmul.h"
#ifdef CAST_WITH_CUDA
#include "cuda/summaries.h"
#endif

// CAST step 6 on the GPU: the reference (ops/attention.cpp) forms W = A_k ⊙ m, its column sums
// and P = W / Σ W in five or six passes over (B, H, N, C); cuda/summaries.cu sums each column in
// one pass and writes P normalised in a second, and its backward likewise. R_inter = Pᵀ V and
// dV = P dR stay products (cuBLAS).
namespace cast::ops {

#ifdef CAST_WITH_CUDA
namespace {
struct SummariesFusedNode final : autograd::Node {
  Tensor a_k, v;  // inputs (B, H, N, C), (B, H, N, d)
  Tensor mask;    // (B, N) or undefined
  Tensor p;       // saved P (B, H, N, C)
  Tensor colsum;  // saved Σ_tokens W (+1e-30): (B·H, C)
  const char* name() const override { return "cluster_summaries_fused"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("a_k", a_k);
    visit.input("v", v);
    visit.input("mask", mask);
    visit.saved("p", p);
    visit.saved("colsum", colsum);
  }
  void backward() override {
    const Tensor& dr = outputs[0].grad();  // (B, H, C, d)
    if (v.requires_grad()) {
      Tensor dv = v.grad_accumulator();
      gemm(dv, p, dr, false, false, 1.0, 1.0, matmul_shape(p, dr, false, false));  // dV += P dR
    }
    if (!a_k.requires_grad()) return;
    const int64_t BH = a_k.dim(0) * a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
    Tensor dp = Tensor::empty(p.shape(), p.dtype(), p.device());
    gemm(dp, v, dr, false, true, 1.0, 0.0, matmul_shape(v, dr, false, true));  // dP = V dRᵀ
    Tensor da = a_k.grad_accumulator().view({BH, N, C});
    cuda::summary_weights_backward(da, dp.view({BH, N, C}), p.view({BH, N, C}), colsum,
                                   mask.defined() ? &mask : nullptr, a_k.dim(1));
  }
};
}  // namespace
#endif

Tensor cluster_summaries_fused(const Tensor& a_k, const Tensor& v, const Tensor& mask) {
  const char* op = "cluster_summaries_fused";
  check_ndim(op, a_k, 4, "a_k");
  check_ndim(op, v, 4, "v");
  check_same_device(op, a_k, v);
  CAST_CHECK(a_k.is_cuda() && a_k.dtype() == DType::f32, "{}: a CUDA f32 kernel, got a_k {}", op, a_k.describe());
  const int64_t B = a_k.dim(0), H = a_k.dim(1), N = a_k.dim(2), C = a_k.dim(3);
  CAST_CHECK(v.dim(0) == B && v.dim(1) == H && v.dim(2) == N, "{}: v {} does not fit a_k {}", op, v.describe(),
             a_k.describe());
  if (mask.defined()) {
    check_same_device(op, a_k, mask);
    CAST_CHECK(mask.shape() == (Shape{B, N}), "{}: mask {} must be [{}, {}]", op, mask.describe(), B, N);
  }
#ifdef CAST_WITH_CUDA
  Tensor p = Tensor::empty(a_k.shape(), a_k.dtype(), a_k.device());
  Tensor colsum = Tensor::empty({B * H, C}, a_k.dtype(), a_k.device());
  Tensor p3 = p.view({B * H, N, C});
  cuda::summary_weights_forward(p3, colsum, a_k.view({B * H, N, C}), mask.defined() ? &mask : nullptr, H);
  Tensor r = Tensor::empty({B, H, C, v.dim(3)}, v.dtype(), v.device());
  gemm(r, p, v, true, false, 1.0, 0.0, matmul_shape(p, v, true, false));  // R_inter = Pᵀ V
  if (autograd::needs_grad({&a_k, &v})) {
    auto node = std::make_unique<SummariesFusedNode>();
    node->a_k = a_k, node->v = v, node->mask = mask, node->p = p, node->colsum = colsum;
    node->outputs = {r};
    autograd::record(std::move(node));
  }
  return r;
#else
  (void)C;
  throw Error(fmt::format("{}: cast was built without CUDA", op));
#endif
}

}  // namespace cast::ops
