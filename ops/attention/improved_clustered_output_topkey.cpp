#include <cmath>
#include <memory>

#include "autograd/tape.h"
#include "ops/attention/cluster_index.h"
#include "ops/attention/fast_paths.h"
#include "ops/ops.h"
#ifdef CAST_WITH_CUDA
#include "cuda/attention/improved_clustered_output_topkey.h"
#endif

// Improved clustered attention (§4) on the GPU. For query i in cluster j, with T = T_j its top keys:
//   O_i = m̂_j · softmax(Q_i K_Tᵀ/√d) V_T + (A^c_j ⊙ 1[l ∉ T]) V,   m̂_j = Σ_{l ∈ T} A^c_jl
// The top-key term is one node over cuda/attention/improved_clustered_output_topkey.cu: each query runs an online
// softmax over its cluster's top keys, read in place, and saves one log-sum-exp; the backward recomputes the
// probabilities, one block per cluster summing dK_T and dV_T in shared memory. The reference
// (ops/attention/improved_clustered_output.cpp) copies K_T and V_T for every query: two tensors of B·H·N·k·d. The rest
// is the same composition as the reference's, in recorded basic ops.
namespace cast::ops {

#ifdef CAST_WITH_CUDA
namespace {
// softmax(Q_i K_Tᵀ/√d) V_T for every query: q, k, v (B·H, N, d) -> (B·H, N, d); 0 for an
// unassigned query or a cluster without keys.
struct TopKeyAttentionNode final : autograd::Node {
  Tensor q, k, v;     // inputs (B·H, N, d)
  Tensor keys;        // top keys (B·H, C·k) i32, −1 = empty slot
  Tensor assignment;  // (B·H, N) i32
  Tensor lse;         // saved log-sum-exp of each query's softmax: (B·H, N)
  int64_t clusters, top;
  double factor;
  const char* name() const override { return "topkey_attention"; }
  void fields(autograd::FieldVisitor& visit) const override {
    visit.input("q", q);
    visit.input("k", k);
    visit.input("v", v);
    visit.input("keys", keys);
    visit.input("assignment", assignment);
    visit.saved("lse", lse);
  }
  void backward() override {
    Tensor dq = q.requires_grad() ? q.grad_accumulator() : Tensor();
    Tensor dk = k.requires_grad() ? k.grad_accumulator() : Tensor();
    Tensor dv = v.requires_grad() ? v.grad_accumulator() : Tensor();
    cuda::topkey_attention_backward(dq.defined() ? &dq : nullptr, dk.defined() ? &dk : nullptr,
                                    dv.defined() ? &dv : nullptr, outputs[0].grad(), q, k, v, keys, assignment,
                                    outputs[0], lse, clusters, top, factor);
  }
};

Tensor topkey_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& keys, const Tensor& assign,
                        int64_t clusters, int64_t top) {
  const double factor = 1.0 / std::sqrt(static_cast<double>(q.dim(2)));
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({q.dim(0), q.dim(1)}, q.dtype(), q.device());
  cuda::topkey_attention_forward(out, lse, q, k, v, keys, assign, clusters, top, factor);
  if (autograd::needs_grad({&q, &k, &v})) {
    auto node = std::make_unique<TopKeyAttentionNode>();
    node->q = q, node->k = k, node->v = v, node->keys = keys, node->assignment = assign, node->lse = lse;
    node->clusters = clusters, node->top = top, node->factor = factor;
    node->outputs = {out};
    autograd::record(std::move(node));
  }
  return out;
}
}  // namespace
#endif

Tensor improved_clustered_output_topkey(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a_c,
                                        const Tensor& top_keys, const Tensor& assignment) {
  const char* op = "improved_clustered_output_topkey";
  check_improved_clustered_inputs(op, q, k, v, a_c, top_keys, assignment);
  const int64_t B = q.dim(0), H = q.dim(1), N = q.dim(2), d = q.dim(3), BH = B * H;
  const int64_t C = a_c.dim(2), top = top_keys.dim(3);
#ifdef CAST_WITH_CUDA
  CAST_CHECK(q.is_cuda() && q.dtype() == DType::f32 && cuda::topkey_attention_fits(top, d),
             "{}: a CUDA f32 kernel for {} top keys of width {} at most as shared memory allows, got q {}", op, top, d,
             q.describe());
  const Tensor keys = top_keys.view({BH, C * top}), assign = assignment.view({BH, N});
  // m̂_j = Σ_{l ∈ T_j} A^c_jl, handed to each member query: (B·H, N, 1)
  Tensor m_hat = sum(gather_rows(reshape(a_c, {BH * C, N, 1}), top_keys.view({BH * C, top})), 1);
  Tensor m_query = gather_rows(reshape(m_hat, {BH, C, 1}), assign);
  Tensor top_out =
      topkey_attention(reshape(q, {BH, N, d}), reshape(k, {BH, N, d}), reshape(v, {BH, N, d}), keys, assign, C, top);
  // the keys outside T keep their centroid attention weight
  Tensor outside;
  top_key_masks(nullptr, outside, top_keys, assign, a_c);
  Tensor rest = matmul(mul(a_c, outside), v);  // (B, H, C, d)
  Tensor out = add(gather_rows(reshape(rest, {BH, C, d}), assign), mul(m_query, top_out));
  return reshape(out, {B, H, N, d});
#else
  (void)B, (void)N, (void)d, (void)BH, (void)C, (void)top;
  throw Error(fmt::format("{}: cast was built without CUDA", op));
#endif
}

// ---------------------------------------------------------------- its row of the fast-path table
static bool topkey_fits(const StepSizes& s) {
#ifdef CAST_WITH_CUDA
  return cuda_f32(s) && cuda::topkey_attention_fits(s.top_keys, s.head_width);
#else
  (void)s;
  return false;
#endif
}

FastPath improved_clustered_output_topkey_path() {
  return fast_path<ImprovedClusteredOutputInputs>(
      "improved_clustered_output_topkey", __FILE__, "CUDA f32 where a cluster's top-key gradients fit in shared memory",
      topkey_fits, [](const ImprovedClusteredOutputInputs& in) {
        return improved_clustered_output_topkey(in.q, in.k, in.v, in.a_c, in.top_keys, in.assignment);
      });
}

}  // namespace cast::ops
