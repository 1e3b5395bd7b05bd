#include <memory>

#include "autograd/tape.h"
#include "ops/fast.h"
#include "ops/matmul.h"
#include "ops/rows.h"
#ifdef CAST_WITH_CUDA
#include "cuda/combine.h"
#endif

// CAST step 7 on the GPU: O = W R_inter + Σ_{(c,p): I_c[p] = i} W[i,c] (R_intra[c][p] − R_inter[c]).
// The dense part stays a product; cuda/combine.cu writes each slot's weighted difference
// straight into its token's row, so the reference's (B·H, C, κ, d) differences and products
// (ops/attention.cpp) are never stored. Its backward walks each cluster's slots once, with one
// writer per dW entry.
namespace cast::ops {

#ifdef CAST_WITH_CUDA
namespace {
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
    if (r_inter.defined() && w.requires_grad()) {
      Tensor dw = w.grad_accumulator();
      gemm(dw, dout, r_inter, false, true, 1.0, 1.0, matmul_shape(dout, r_inter, false, true));  // dW += dO R_interᵀ
    }
    if (r_inter.defined() && r_inter.requires_grad()) {
      Tensor dr = r_inter.grad_accumulator();
      gemm(dr, w, dout, true, false, 1.0, 1.0, matmul_shape(w, dout, true, false));  // dR_inter += Wᵀ dO
    }
    Tensor dw = w.requires_grad() ? w.grad_accumulator().view({BH, N, C}) : Tensor();
    Tensor dintra = r_intra.requires_grad() ? r_intra.grad_accumulator().view({BH, C, kappa, d}) : Tensor();
    Tensor dinter =
        r_inter.defined() && r_inter.requires_grad() ? r_inter.grad_accumulator().view({BH, C, d}) : Tensor();
    const Tensor inter = r_inter.defined() ? r_inter.view({BH, C, d}) : Tensor();
    cuda::combine_sparse_backward(dw.defined() ? &dw : nullptr, dintra.defined() ? &dintra : nullptr,
                                  dinter.defined() ? &dinter : nullptr, dout.view({BH, N, d}), w.view({BH, N, C}),
                                  r_intra.view({BH, C, kappa, d}), inter.defined() ? &inter : nullptr, members);
  }
};
}  // namespace
#endif

Tensor combine_clusters_fused(const Tensor& w, const Tensor& r_intra, const Tensor& r_inter, const Tensor& members) {
  const char* op = "combine_clusters_fused";
  check_ndim(op, w, 4, "w");
  check_ndim(op, r_intra, 5, "r_intra");
  check_ndim(op, members, 4, "members");
  check_dtype(op, members, DType::i32, "members");
  check_same_device(op, w, r_intra);
  check_same_device(op, w, members);
  CAST_CHECK(w.is_cuda() && w.dtype() == DType::f32, "{}: a CUDA f32 kernel, got w {}", op, w.describe());
  const int64_t B = w.dim(0), H = w.dim(1), N = w.dim(2), C = w.dim(3);
  const int64_t kappa = members.dim(3), d = r_intra.dim(4), BH = B * H;
  CAST_CHECK(r_intra.shape() == (Shape{B, H, C, kappa, d}) && members.shape() == (Shape{B, H, C, kappa}),
             "{}: r_intra {} and members {} do not fit w {}", op, r_intra.describe(), members.describe(), w.describe());
  if (r_inter.defined()) {
    check_same_device(op, w, r_inter);
    CAST_CHECK(r_inter.shape() == (Shape{B, H, C, d}), "{}: r_inter {} must be [{}, {}, {}, {}]", op,
               r_inter.describe(), B, H, C, d);
  }
  Tensor idx = members.view({BH, C * kappa});
  check_index_range(op, idx, -1, N);
#ifdef CAST_WITH_CUDA
  Tensor out = Tensor::zeros({B, H, N, d}, w.dtype(), w.device());
  if (r_inter.defined()) gemm(out, w, r_inter, false, false, 1.0, 0.0, matmul_shape(w, r_inter, false, false));
  Tensor out3 = out.view({BH, N, d});
  const Tensor inter = r_inter.defined() ? r_inter.view({BH, C, d}) : Tensor();
  cuda::combine_sparse_forward(out3, w.view({BH, N, C}), r_intra.view({BH, C, kappa, d}),
                               inter.defined() ? &inter : nullptr, idx);
  if (autograd::needs_grad({&w, &r_intra, &r_inter})) {
    auto node = std::make_unique<CombineFusedNode>();
    node->w = w, node->r_intra = r_intra, node->r_inter = r_inter, node->members = idx;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
#else
  throw Error(fmt::format("{}: cast was built without CUDA", op));
#endif
}

}  // namespace cast::ops
