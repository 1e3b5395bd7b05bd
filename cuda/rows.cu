// Row gather (-1 = zero row) and its adjoint, scatter-add with atomics; index range checks.
#include <climits>
#include <cstdint>
#include <type_traits>

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

// The same four floats at a time with 32-bit index math, where rows are whole float4s (d % 4 == 0,
// 16-byte aligned) and every offset fits: d4 = d / 4. CAST gathers (B·H, C·κ, d) rows of d 64;
// element by element, three 64-bit divides each, that ran at a third of the memory's bandwidth
// on an H100.
template <class I>
__global__ void gather4_kernel(float4* out, const float4* x, const I* idx, int32_t total4, int32_t n, int32_t m,
                               int32_t d4, bool accumulate) {
  CAST_KERNEL_LOOP(e, total4) {
    const int32_t e32 = static_cast<int32_t>(e), row = e32 / d4, j = e32 - row * d4, b = row / m;
    const int64_t src = idx[row];
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (src >= 0 && src < n) v = x[(b * n + static_cast<int32_t>(src)) * d4 + j];  // a bad index is reported, not read
    if (accumulate) {
      const float4 o = out[e];
      v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
    }
    out[e] = v;
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
  const bool fours = d % 4 == 0 && reinterpret_cast<uintptr_t>(fptr(out)) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(fptr(x)) % 16 == 0 && total < INT32_MAX && b * n * d < INT32_MAX;
  if (fours) {
    const auto launch = [&](const auto* ids) {
      using I = std::remove_cv_t<std::remove_pointer_t<decltype(ids)>>;
      CAST_LAUNCH(gather4_kernel<I>, blocks_for(total / 4), kThreads, 0, reinterpret_cast<float4*>(fptr(out)),
                  reinterpret_cast<const float4*>(fptr(x)), ids, static_cast<int32_t>(total / 4),
                  static_cast<int32_t>(n), static_cast<int32_t>(m), static_cast<int32_t>(d / 4), accumulate);
    };
    if (idx.dtype() == DType::i32) launch(idx.data<int32_t>());
    else launch(idx.data<int64_t>());
  } else if (idx.dtype() == DType::i32)
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
