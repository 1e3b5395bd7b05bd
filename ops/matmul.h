#pragma once
// Matrix products. a: (..., M, K) (or (..., K, M) with trans_a), b: (..., K, N) (or (..., N, K)
// with trans_b), same leading batch dims; b may also be 2-D and shared by every batch (a linear
// layer), in which case trans_a must be false.
#include <type_traits>
#include <vector>

#include "cpu/gemm_tile.h"
#include "tensor/matrix_layout.h"
#include "tensor/tensor.h"

namespace cast::ops {

struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
};

// c = alpha * op(a) op(b) + beta * c, batched over the leading dims (all contiguous).
void gemm(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha, double beta,
          const GemmShape& shape);

GemmShape matmul_shape(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);

// c = alpha op(a) op(b) + beta c over shape.batch products whose matrices lie in the tensors as
// their layouts say (tensor/matrix_layout.h): op(a) (m, k), op(b) (k, n), c (m, n) of each. Every
// layout is checked to stay inside its tensor, and c's matrices not to overlap one another. On
// CUDA at --precision bf16, a and b may be BF16 tensors (an FP32 c): an operand several products
// read is then rounded once (as_product_operand), not once per product.
void gemm_laid_out(Tensor& c, const MatrixLayout& lc, const Tensor& a, const MatrixLayout& la, const Tensor& b,
                   const MatrixLayout& lb, bool trans_a, bool trans_b, double alpha, double beta,
                   const GemmShape& shape);

// Whether the products on x's device read BF16 operands: on CUDA at --precision bf16 (with BF16
// operand copies, tensor/precision.h). A BF16 tensor may then be an operand beside FP32 ones, and
// an op whose output only products read may write it in BF16 (ops::mlp's hidden activation).
bool products_take_bf16(const Tensor& x);
// x as the products at the current precision read it on x's device: a BF16 copy on CUDA at
// --precision bf16, x itself otherwise.
Tensor as_product_operand(const Tensor& x);
// a and b as one product's operands: float tensors of one dtype, or BF16 beside FP32 where the
// products take BF16 (products_take_bf16); throws naming the op otherwise.
void check_operand_pair(const char* op, const Tensor& a, const char* a_name, const Tensor& b, const char* b_name);

// c += alpha Σ_i op(a_i) op(b_i) over the leading dim i of a and b; c has the shape of one term.
// The gradient of an operand a whole batch shares (CAST's surrogates). The CPU adds the terms
// one product at a time; CUDA forms them in one batched product and then sums them, since one
// product per batch row would leave most of the GPU idle.
void gemm_sum_over_batch(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha);
void matmul_forward(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
// da = dc op(b)ᵀ + beta_a da (arranged for trans_a), db = op(a)ᵀ dc + beta_b db (arranged for
// trans_b): beta 1 adds into the gradients, beta 0 writes a fresh buffer.
void matmul_backward(Tensor* da, Tensor* db, const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a,
                     bool trans_b, double beta_a = 1.0, double beta_b = 1.0);

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// The CPU kernel under gemm: the BLAS (default) or the plain-loop reference, for study and
// as the oracle the BLAS path is tested against.
enum class CpuGemm { blas, loops };
void set_cpu_gemm(CpuGemm which);
CpuGemm cpu_gemm();
// Raw kernels on host pointers (row-major operands), for tests and fused CPU ops.
template <class T>
void gemm_loops(T* c, const T* a, const T* b, bool trans_a, bool trans_b, T alpha, T beta, const GemmShape& s);
template <class T>
void gemm_blas(T* c, const T* a, const T* b, bool trans_a, bool trans_b, T alpha, T beta, const GemmShape& s);

// One product on the calling thread: c (m, n) = alpha op(a) op(b) + beta c, row-major and
// packed. The fused CPU kernels call it on tiles inside their own parallel regions. f32 runs the
// register-blocked tile kernel (cpu/gemm_tile.h) unless the BLAS is chosen; f64 runs the BLAS.
template <class T>
inline void gemm_tile(T* c, const T* a, const T* b, bool trans_a, bool trans_b, T alpha, T beta, int64_t m, int64_t n,
                      int64_t k) {
  if constexpr (std::is_same_v<T, float>)
    if (tile_gemm() == TileGemm::kernel) return gemm_tile_kernel(c, a, b, trans_a, trans_b, alpha, beta, m, n, k);
  gemm_blas<T>(c, a, b, trans_a, trans_b, alpha, beta, GemmShape{1, m, n, k});
}

// The right operand op(b) of several tile products, packed once: on f32 with the tile kernel
// and a transposed b it holds op(b)'s panels; otherwise it keeps b and each product calls
// gemm_tile (the tile kernel reads an untransposed b in place).
template <class T>
class TileOperand {
 public:
  void set(const T* b, bool trans_b, int64_t n, int64_t k) {
    b_ = b, trans_b_ = trans_b, n_ = n, k_ = k, packed_ = false;
    if constexpr (std::is_same_v<T, float>) {
      if (tile_gemm() == TileGemm::kernel && trans_b) {
        if (panels_.size() < packed_floats(n, k)) panels_.resize(packed_floats(n, k));
        pack_b(panels_.data(), b, trans_b, n, k);
        packed_ = true;
      }
    }
  }
  // c (m, n) = alpha op(a) op(b) + beta c
  void multiply(T* c, const T* a, bool trans_a, T alpha, T beta, int64_t m) const {
    if constexpr (std::is_same_v<T, float>)
      if (packed_) return gemm_tile_packed(c, a, trans_a, panels_.data(), alpha, beta, m, n_, k_);
    gemm_tile<T>(c, a, b_, trans_a, trans_b_, alpha, beta, m, n_, k_);
  }

 private:
  const T* b_ = nullptr;
  bool trans_b_ = false, packed_ = false;
  int64_t n_ = 0, k_ = 0;
  std::vector<T> panels_;
};

}  // namespace cast::ops
