// Row gather (-1 = zero row) and its adjoint, scatter-add with atomics; index range checks.
#include <climits>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/rows.h"
#include "tensor/device_memory.h"

namespace cast::cuda {

template <class I>
__global__ void min_max_kernel(const I* idx, int64_t n, long long* out) {
  CAST_KERNEL_LOOP(i, n) {
    atomicMin(out, static_cast<long long>(idx[i]));
    atomicMax(out + 1, static_cast<long long>(idx[i]));
  }
}

// The starting values of the min/max pair, written on the device (no copy from the host).
__global__ void min_max_init_kernel(long long* out) {
  if (threadIdx.x == 0) {
    out[0] = LLONG_MAX;
    out[1] = LLONG_MIN;
  }
}

template <class I>
__global__ void gather_kernel(float* out, const float* x, const I* idx, int64_t total, int64_t n, int64_t m,
                              int64_t d, bool accumulate) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t row = e / d, j = e % d, b = row / m;
    const int64_t src = idx[row];
    const float v = src >= 0 ? x[(b * n + src) * d + j] : 0.f;
    out[e] = accumulate ? out[e] + v : v;
  }
}

template <class I>
__global__ void scatter_kernel(float* dx, const float* dout, const I* idx, int64_t total, int64_t n, int64_t m,
                               int64_t d) {
  CAST_KERNEL_LOOP(e, total) {
    const int64_t row = e / d, j = e % d, b = row / m;
    const int64_t dst = idx[row];
    if (dst >= 0) atomicAdd(dx + (b * n + dst) * d + j, dout[e]);
  }
}

// The two results live in a tensor from the caching allocator: after the first call a check
// allocates nothing, and its one copy is the result's way back to the host.
void index_min_max(const Tensor& idx, int64_t& mn, int64_t& mx) {
  long long host[2];
  Tensor result = Tensor::empty({2}, DType::i64, Device::cuda);
  long long* dev = reinterpret_cast<long long*>(result.data<int64_t>());
  CAST_LAUNCH(min_max_init_kernel, 1, 32, 0, dev);
  const int64_t n = idx.numel();
  if (idx.dtype() == DType::i32) CAST_LAUNCH(min_max_kernel<int32_t>, blocks_for(n), kThreads, 0, idx.data<int32_t>(), n, dev);
  else CAST_LAUNCH(min_max_kernel<int64_t>, blocks_for(n), kThreads, 0, idx.data<int64_t>(), n, dev);
  CUDA_CHECK_LAUNCH();
  device_memory::copy_to_host(host, dev, sizeof(host));
  mn = host[0];
  mx = host[1];
}

void gather_rows(Tensor& out, const Tensor& x, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d,
                 bool accumulate) {
  const int64_t total = b * m * d;
  if (total == 0) return;
  if (idx.dtype() == DType::i32)
    CAST_LAUNCH(gather_kernel<int32_t>, blocks_for(total), kThreads, 0, fptr(out), fptr(x), idx.data<int32_t>(), total, n, m, d, accumulate);
  else
    CAST_LAUNCH(gather_kernel<int64_t>, blocks_for(total), kThreads, 0, fptr(out), fptr(x), idx.data<int64_t>(), total, n, m, d, accumulate);
  CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(Tensor& dx, const Tensor& dout, const Tensor& idx, int64_t b, int64_t n, int64_t m, int64_t d) {
  const int64_t total = b * m * d;
  if (total == 0) return;
  if (idx.dtype() == DType::i32)
    CAST_LAUNCH(scatter_kernel<int32_t>, blocks_for(total), kThreads, 0, fptr(dx), fptr(dout), idx.data<int32_t>(), total, n, m, d);
  else
    CAST_LAUNCH(scatter_kernel<int64_t>, blocks_for(total), kThreads, 0, fptr(dx), fptr(dout), idx.data<int64_t>(), total, n, m, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::cuda
