// The CUDA emulation's own tests: small kernels, correct and deliberately broken, show that a
// barrier is a real rendezvous, that warp functions exchange lanes' values, and that a missing
// barrier (race), a barrier in divergent code, an off-by-one shared index and a warp function
// some lane never reaches are each reported with the kernel, block and thread.
#include <cuda_runtime.h>

#include <vector>

#include "cuda/check.h"
#include "cuda/launch.cuh"
#include "cuda/runtime.h"
#include "cuda/shared_memory.cuh"
#include "cuda/tensor_core.cuh"
#include "tensor/tensor.h"
#include "tests/test_util.h"

using namespace cast;

namespace {

// ---------------------------------------------------------------- kernels
// Block sum through shared memory, the textbook tree: correct.
__global__ void tree_sum(const float* x, float* out, int n) {
  CAST_SHARED_ARRAY(float, buf, 256);
  const int t = threadIdx.x;
  buf[t] = t < n ? x[blockIdx.x * 256 + t] : 0.f;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (t < s) buf[t] = buf[t] + buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

// The same with the barrier inside the loop missing: thread t reads buf[t + s] that thread
// t + s writes in the same phase.
__global__ void tree_sum_missing_barrier(const float* x, float* out, int n) {
  CAST_SHARED_ARRAY(float, buf, 256);
  const int t = threadIdx.x;
  buf[t] = t < n ? x[t] : 0.f;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1)
    if (t < s) buf[t] = buf[t] + buf[t + s];
  if (t == 0) out[0] = buf[0];
}

// A barrier inside a branch that half of the block takes.
__global__ void barrier_in_branch(float* out) {
  CAST_SHARED_ARRAY(float, buf, 256);
  const int t = threadIdx.x;
  buf[t] = static_cast<float>(t);
  if (t < 128) __syncthreads();
  out[t] = buf[t];
}

// Shifting the block's values by one writes one element past the end.
__global__ void shift_off_by_one(const float* x, float* out) {
  CAST_SHARED_ARRAY(float, buf, 256);
  const int t = threadIdx.x;
  buf[t + 1] = x[t];
  __syncthreads();
  out[t] = t > 0 ? buf[t] : 0.f;
}

// Warp sums by xor-shuffles, a broadcast from lane 3, a ballot and a shift down.
__global__ void warp_functions(const float* x, float* sum, float* from3, unsigned* ballot, float* down) {
  const int t = threadIdx.x;
  float v = x[t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[t] = v;
  from3[t] = __shfl_sync(0xffffffffu, x[t], 3);
  ballot[t] = __ballot_sync(0xffffffffu, x[t] > 0.f);
  down[t] = __shfl_down_sync(0xffffffffu, x[t], 1);
}

// Lane 0 leaves before the others call a warp function over the full mask.
__global__ void warp_function_after_exit(float* out) {
  const int t = threadIdx.x;
  if (t == 0) return;
  out[t] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// Each thread copies its value into shared memory by cp.async and reads it back before and after
// waiting for the copy: only the read after the wait sees it.
__global__ void cp_async_read_before_wait(const float* x, float* before, float* after) {
  CAST_SHARED_ARRAY(float, buf, 32 * 4);
  const int t = threadIdx.x;
  buf[4 * t] = -1.f;
  cuda::tc::cp_async16(buf, 4 * t, x + 4 * t, true);
  cuda::tc::cp_async_commit();
  before[t] = buf[4 * t];
  cuda::tc::cp_async_wait<0>();
  after[t] = buf[4 * t];
}

// Half the warp reaches an mma while the other half is at a shuffle.
__global__ void mma_beside_a_shuffle(float* out) {
  const int t = threadIdx.x;
  if (t < 16) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    cuda::tc::mma_bf16(d, a, b);
    out[t] = d[0];
  } else {
    out[t] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
  }
}

__global__ void grid_stride_fill(int* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    out[i] += 1;
}

__global__ void atomic_total(float* total, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    atomicAdd(total, 1.f);
}

// Reverses the block's values through dynamic shared memory of `count` floats.
__global__ void reverse_dynamic(const float* x, float* out, int count) {
  CAST_DYNAMIC_SHARED(float, tile, count);
  const int t = threadIdx.x;
  tile[t] = x[t];
  __syncthreads();
  out[t] = tile[blockDim.x - 1 - t];
}

// Runs `launch` and returns the emulation's error message ("" when none).
template <class Fn>
std::string error_of(Fn&& launch) {
  try {
    launch();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A host vector's copy in device memory for one launch: kernels take device pointers (the
// emulation refuses a host one, as a GPU faults on it); the copy goes back when the launch's
// statement ends.
template <class T>
class OnDevice {
 public:
  explicit OnDevice(std::vector<T>& host) : host_(host) {
    CUDA_CHECK(cudaMalloc(&ptr_, host.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  OnDevice(const OnDevice&) = delete;
  ~OnDevice() {
    (void)cudaMemcpy(host_.data(), ptr_, host_.size() * sizeof(T), cudaMemcpyDeviceToHost);
    (void)cudaFree(ptr_);
  }
  operator T*() const { return ptr_; }

 private:
  std::vector<T>& host_;
  T* ptr_ = nullptr;
};
template <class T>
OnDevice<T> dev(std::vector<T>& host) {
  return OnDevice<T>(host);
}

std::vector<float> iota_floats(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i % 7) - 3.f;
  return v;
}

}  // namespace

// ---------------------------------------------------------------- correct kernels pass
TEST(Emulation, CorrectReductionPassesAndIsRight) {
  std::vector<float> x = iota_floats(512), out(2, -1.f);
  CAST_LAUNCH(tree_sum, 2, 256, 0, dev(x), dev(out), 256);
  for (int b = 0; b < 2; ++b) {
    float want = 0;
    for (int i = 0; i < 256; ++i) want += x[b * 256 + i];
    EXPECT_FLOAT_EQ(out[b], want) << "block " << b;
  }
}

TEST(Emulation, WarpFunctionsExchangeLanes) {
  std::vector<float> x = iota_floats(64), sum(64), from3(64), down(64);
  std::vector<unsigned> ballot(64);
  CAST_LAUNCH(warp_functions, 1, 64, 0, dev(x), dev(sum), dev(from3), dev(ballot), dev(down));
  for (int w = 0; w < 2; ++w) {
    float total = 0;
    unsigned bits = 0;
    for (int l = 0; l < 32; ++l) {
      total += x[w * 32 + l];
      bits |= (x[w * 32 + l] > 0.f ? 1u : 0u) << l;
    }
    for (int l = 0; l < 32; ++l) {
      const int t = w * 32 + l;
      EXPECT_FLOAT_EQ(sum[t], total) << t;
      EXPECT_EQ(from3[t], x[w * 32 + 3]) << t;
      EXPECT_EQ(ballot[t], bits) << t;
      EXPECT_EQ(down[t], l < 31 ? x[t + 1] : x[t]) << t;  // the last lane keeps its own value
    }
  }
}

TEST(Emulation, GridStrideLoopsAndAtomicsOverManyBlocks) {
  const int64_t n = 100000;
  std::vector<int> hits(n, 0);
  CAST_LAUNCH(grid_stride_fill, 7, 128, 0, dev(hits), n);  // fewer threads than elements
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << i;
  std::vector<float> total(1, 0.f);
  CAST_LAUNCH(atomic_total, 13, 64, 0, dev(total), int64_t{5000});
  EXPECT_EQ(total[0], 5000.f);
}

TEST(Emulation, DynamicSharedMemory) {
  std::vector<float> x = iota_floats(96), out(96);
  CAST_LAUNCH(reverse_dynamic, 1, 96, 96 * sizeof(float), dev(x), dev(out), 96);
  for (int t = 0; t < 96; ++t) EXPECT_EQ(out[t], x[95 - t]);
  // asking for more elements than the launch gave is an error, not a silent overrun
  const std::string e =
      error_of([&] { CAST_LAUNCH(reverse_dynamic, 1, 96, 64 * sizeof(float), dev(x), dev(out), 96); });
  EXPECT_NE(e.find("dynamic shared memory 'tile'"), std::string::npos) << e;
}

// ---------------------------------------------------------------- broken kernels are caught
TEST(Emulation, MissingBarrierIsReportedAsARace) {
  std::vector<float> x = iota_floats(256), out(1);
  const std::string e = error_of([&] { CAST_LAUNCH(tree_sum_missing_barrier, 1, 256, 0, dev(x), dev(out), 256); });
  EXPECT_NE(e.find("shared-memory race on 'buf'"), std::string::npos) << e;
  EXPECT_NE(e.find("kernel tree_sum_missing_barrier, block (0, 0, 0), thread"), std::string::npos) << e;
}

TEST(Emulation, BarrierInDivergentBranchIsReported) {
  std::vector<float> out(256);
  const std::string e = error_of([&] { CAST_LAUNCH(barrier_in_branch, 1, 256, 0, dev(out)); });
  EXPECT_NE(e.find("barrier divergence in kernel barrier_in_branch, block (0, 0, 0)"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 0-127 wait at __syncthreads()"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 128-255 have exited"), std::string::npos) << e;
}

TEST(Emulation, OffByOneSharedIndexIsOutOfBounds) {
  std::vector<float> x = iota_floats(256), out(256);
  const std::string e = error_of([&] { CAST_LAUNCH(shift_off_by_one, 1, 256, 0, dev(x), dev(out)); });
  EXPECT_NE(e.find("shared memory 'buf' index 256 out of bounds [0, 256)"), std::string::npos) << e;
  EXPECT_NE(e.find("thread (255, 0, 0)"), std::string::npos) << e;
}

TEST(Emulation, WarpFunctionWaitingForAnExitedLane) {
  std::vector<float> out(32);
  const std::string e = error_of([&] { CAST_LAUNCH(warp_function_after_exit, 1, 32, 0, dev(out)); });
  EXPECT_NE(e.find("never completes"), std::string::npos) << e;
  EXPECT_NE(e.find("waits for threads 0"), std::string::npos) << e;
}

// A cp.async copy lands when its thread waits for it, as the PTX ISA promises no earlier: a read
// before the wait sees what was there.
TEST(Emulation, CpAsyncLandsAtTheWait) {
  std::vector<float> x(128), before(32), after(32);
  for (int i = 0; i < 128; ++i) x[i] = static_cast<float>(i);
  CAST_LAUNCH(cp_async_read_before_wait, 1, 32, 0, dev(x), dev(before), dev(after));
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(before[t], -1.f) << t;
    EXPECT_EQ(after[t], static_cast<float>(4 * t)) << t;
  }
}

TEST(Emulation, LanesAtAnMmaAndAShuffleAreAnError) {
  std::vector<float> out(32);
  const std::string e = error_of([&] { CAST_LAUNCH(mma_beside_a_shuffle, 1, 32, 0, dev(out)); });
  EXPECT_NE(e.find("lanes of warp 0 meet at different warp"), std::string::npos) << e;
}

TEST(Emulation, InvalidLaunchConfigurations) {
  std::vector<float> out(1);
  EXPECT_CAST_ERROR(CAST_LAUNCH(barrier_in_branch, 0, 256, 0, dev(out)), "invalid configuration");
  EXPECT_CAST_ERROR(CAST_LAUNCH(barrier_in_branch, 1, 2048, 0, dev(out)), "at most 1024 threads");
}

TEST(Emulation, TheCorrectKernelsRaiseNoError) {
  // the same three checks on the correct versions: nothing is reported
  std::vector<float> x = iota_floats(256), out(256);
  EXPECT_EQ(error_of([&] { CAST_LAUNCH(tree_sum, 1, 256, 0, dev(x), dev(out), 256); }), "");
  EXPECT_EQ(error_of([&] { CAST_LAUNCH(reverse_dynamic, 1, 256, 256 * sizeof(float), dev(x), dev(out), 256); }), "");
}

// Out of device memory: the allocator gives its cache back and retries once; when that is not
// enough, one error names the size asked for and the bytes tensors hold.
TEST(Emulation, OutOfDeviceMemoryFreesTheCacheThenSaysWhatItAskedFor) {
  cuda::release_cached_memory();
  const size_t in_use = emu::runtime_counts().bytes_in_use;
  {
    Tensor cached = Tensor::empty({3 << 18}, DType::f32, Device::cuda);  // 3 MiB, cached when freed
  }
  const size_t cached_mallocs = cuda::memory_stats().device_mallocs;
  // 6 MiB fits only if the cached 3 MiB go back to the driver first
  emu::set_device_memory_limit(in_use + (7 << 20));
  {
    Tensor big = Tensor::empty({6 << 18}, DType::f32, Device::cuda);
    EXPECT_EQ(cuda::memory_stats().device_mallocs, cached_mallocs + 1);
    EXPECT_CAST_ERROR(Tensor::empty({4 << 18}, DType::f32, Device::cuda),
                      "CUDA out of memory: 4.0 MiB asked for while tensors hold 6.0 MiB");
  }
  emu::set_device_memory_limit(0);
  Tensor after = Tensor::empty({4 << 18}, DType::f32, Device::cuda);  // the device is usable again
  EXPECT_EQ(after.numel(), 4 << 18);
}

// Size classes and best fit: a freed block serves a smaller request of another size.
TEST(Emulation, CachedBlocksServeOtherSizes) {
  cuda::release_cached_memory();
  { Tensor a = Tensor::empty({1000000}, DType::f32, Device::cuda); }  // 4 MB, cached
  const size_t mallocs = cuda::memory_stats().device_mallocs;
  { Tensor b = Tensor::empty({700000}, DType::f32, Device::cuda); }  // 2.8 MB: the 4 MB block
  { Tensor c = Tensor::empty({999999}, DType::f32, Device::cuda); }
  EXPECT_EQ(cuda::memory_stats().device_mallocs, mallocs);
  { Tensor d = Tensor::empty({200000}, DType::f32, Device::cuda); }  // 0.8 MB: not from a block 5 times its size
  EXPECT_EQ(cuda::memory_stats().device_mallocs, mallocs + 1);
  { Tensor e = Tensor::empty({1000}, DType::f32, Device::cuda); }  // 4 KB: the cached 0.8 MB small block
  EXPECT_EQ(cuda::memory_stats().device_mallocs, mallocs + 1);
}

// A GPU faults on a host pointer handed to a kernel; the emulation, whose device memory is host
// memory, refuses it at the launch, naming the kernel and the argument.
TEST(Emulation, HostPointerArgumentIsRefused) {
  std::vector<float> x = iota_floats(256), out(256);
  const std::string e = error_of([&] { CAST_LAUNCH(tree_sum, 1, 256, 0, dev(x), out.data(), 256); });
  EXPECT_NE(e.find("kernel tree_sum argument 1"), std::string::npos) << e;
  EXPECT_NE(e.find("not device memory"), std::string::npos) << e;
  // a device pointer one past the end of its block (an empty tensor's end) is still device memory
  std::vector<int> empty_tail(4, 0);
  EXPECT_EQ(error_of([&] {
              OnDevice<int> d(empty_tail);
              CAST_LAUNCH(grid_stride_fill, 1, 32, 0, static_cast<int*>(d) + empty_tail.size(), int64_t{0});
            }),
            "");
}

// More than 48 KiB of dynamic shared memory needs the kernel's opt-in, as on a GPU.
TEST(Emulation, LargeDynamicSharedMemoryNeedsTheOptIn) {
  std::vector<float> x = iota_floats(96), out(96);
  const size_t bytes = 100 * 1024;
  const std::string e = error_of([&] { CAST_LAUNCH(reverse_dynamic, 1, 96, bytes, dev(x), dev(out), 96); });
  EXPECT_NE(e.find("48 KiB without an opt-in"), std::string::npos) << e;
  ASSERT_EQ(cudaFuncSetAttribute(reverse_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), cudaSuccess);
  EXPECT_EQ(error_of([&] { CAST_LAUNCH(reverse_dynamic, 1, 96, bytes, dev(x), dev(out), 96); }), "");
  EXPECT_NE(cudaFuncSetAttribute(reverse_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaSuccess);
}

// After a kernel's illegal address every runtime call fails with it: the allocator says so
// instead of blaming the batch size.
TEST(Emulation, StickyKernelErrorIsNotReportedAsOutOfMemory) {
  cuda::release_cached_memory();
  emu::set_sticky_error(cudaErrorIllegalAddress);
  std::string e;
  try {
    Tensor t = Tensor::empty({12345}, DType::f32, Device::cuda);
  } catch (const Error& err) {
    e = err.what();
  }
  emu::set_sticky_error(cudaSuccess);
  EXPECT_NE(e.find("an illegal memory access was encountered"), std::string::npos) << e;
  EXPECT_EQ(e.find("out of memory"), std::string::npos) << e;
  EXPECT_EQ(e.find("batch size"), std::string::npos) << e;
}
