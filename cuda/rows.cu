// Row gather (-1 = zero row) and its adjoint, scatter-add with atomics; index range checks.
#include "cuda/common.cuh"
#include "cuda/deferred_checks.h"
#include "cuda/launch.cuh"
#include "cuda/rows.h"

namespace cast::cuda {

template <class I>
__global__ void range_check_kernel(const I* idx, int64_t n, int64_t lo, int64_t hi, unsigned long long* fault,
                                   uint32_t id) {
  CAST_KERNEL_LOOP(i, n) {
    const int64_t v = idx[i];
    if (v < lo || v >= hi)  // any failing value will do: one plain 64-bit store, no atomics on host memory
      *fault = (static_cast<unsigned long long>(id) << 48) | (static_cast<unsigned long long>(v) & 0xFFFFFFFFFFFFull);
  }
}

template <class I>
__global__ void gather_kernel(float* out, const float* x, const I* idx, int64_t total, int64_t n, int64_t m, int64_t d,
                              bool accumulate) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t row = e / d, j = e % d, b = row / m;
    const int64_t src = idx[row];
    const float v = src >= 0 && src < n ? x[(b * n + src) * d + j] : 0.f;  // a bad index is reported, not read
    out[e] = accumulate ? out[e] + v : v;
  }
}

template <class I>
__global__ void scatter_kernel(float* dx, const float* dout, const I* idx, int64_t total, int64_t n, int64_t m,
                               int64_t d) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t row = e / d, j = e % d, b = row / m;
    const int64_t dst = idx[row];
    if (dst >= 0 && dst < n) atomicAdd(dx + (b * n + dst) * d + j, dout[e]);
  }
}

void check_index_range_later(const char* op, const Tensor& idx, int64_t lo, int64_t hi) {
  const int64_t n = idx.numel();
  if (n == 0) return;
  const PendingCheck check = register_index_check(op, lo, hi);
  if (idx.dtype() == DType::i32)
    CAST_LAUNCH(range_check_kernel<int32_t>, blocks_for(n), kThreads, 0, idx.data<int32_t>(), n, lo, hi, check.fault,
                check.id);
  else
    CAST_LAUNCH(range_check_kernel<int64_t>, blocks_for(n), kThreads, 0, idx.data<int64_t>(), n, lo, hi, check.fault,
                check.id);
  CUDA_CHECK_LAUNCH();
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d,
                 bool accumulate) {
  const int64_t total = b * m * d;
  if (total == 0) return;
  if (idx.dtype() == DType::i32)
    CAST_LAUNCH(gather_kernel<int32_t>, blocks_for(total), kThreads, 0, fptr(out), fptr(x), idx.data<int32_t>(), total,
                n, m, d, accumulate);
  else
    CAST_LAUNCH(gather_kernel<int64_t>, blocks_for(total), kThreads, 0, fptr(out), fptr(x), idx.data<int64_t>(), total,
                n, m, d, accumulate);
  CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(Tensor& dx, const Tensor& dout, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d) {
  const int64_t total = b * m * d;
  if (total == 0) return;
  if (idx.dtype() == DType::i32)
    CAST_LAUNCH(scatter_kernel<int32_t>, blocks_for(total), kThreads, 0, fptr(dx), fptr(dout), idx.data<int32_t>(),
                total, n, m, d);
  else
    CAST_LAUNCH(scatter_kernel<int64_t>, blocks_for(total), kThreads, 0, fptr(dx), fptr(dout), idx.data<int64_t>(),
                total, n, m, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
