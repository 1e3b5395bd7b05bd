// Caching device allocator, device-memory services for tensor/, the cuBLAS handle.
#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/launch.cuh"
#include "cuda/deferred_checks.h"
#include "cuda/runtime.h"
#include "tensor/device_memory.h"

namespace cast::cuda {

namespace {
// Size classes and best fit (the scheme of PyTorch's and TensorFlow's caching allocators, made
// smaller): a request is rounded up to a multiple of 512 B below 1 MiB, and above that to a
// quarter of its power of two, so at most a fifth of a block goes unused. Freed blocks wait in a
// map ordered by size; a request takes the smallest cached block that fits (see `fits`). Blocks
// therefore serve other sizes: a batch padded shorter than an earlier one
// reuses that batch's blocks, and training with varying shapes stops calling cudaMalloc once its
// largest shapes have been seen. Out of memory: the cache goes back to the driver and the
// cudaMalloc is tried once more, then one error names the size asked for and the bytes in use.
struct CachingAllocator {
  std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;  // cached: size -> block
  std::unordered_map<void*, size_t> live;    // handed out: block -> its size
  MemoryStats stats;

  static size_t size_class(size_t bytes) {
    if (bytes <= (size_t{1} << 20)) return bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
    size_t power = size_t{1} << 20;
    while (power < bytes / 2) power <<= 1;  // power < bytes <= 2 * power
    const size_t quarter = power / 4;
    return (bytes + quarter - 1) / quarter * quarter;
  }

  // Small blocks (up to 1 MiB) serve any small request they hold; a large block serves requests
  // of at least a quarter of its size, so a large block is never tied up by a small tensor.
  static bool fits(size_t want, size_t block) {
    constexpr size_t small = size_t{1} << 20;
    return block <= small ? want <= small : block <= 4 * want;
  }

  void* allocate(size_t bytes) {
    const size_t want = size_class(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    void* ptr = nullptr;
    size_t size = want;
    auto it = free_blocks.lower_bound(want);
    if (it != free_blocks.end() && fits(want, it->first)) {
      size = it->first;
      ptr = it->second;
      free_blocks.erase(it);
    } else {
      cudaError_t err = cudaMalloc(&ptr, want);
      if (err == cudaErrorMemoryAllocation) {  // give the cache back to the driver and try once more
        (void)cudaGetLastError();
        release_locked();
        err = cudaMalloc(&ptr, want);
      }
      // Anything but running out is an earlier failure showing here: after an illegal address
      // every call returns the kernel's error, and "lower the batch size" would mislead.
      if (err != cudaSuccess && err != cudaErrorMemoryAllocation)
        throw Error(
            fmt::format("CUDA error: {} (reported while allocating {} bytes; an earlier kernel failed, "
                        "and the device is unusable until the process ends)",
                        cudaGetErrorString(err), want));
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        constexpr double MiB = 1024.0 * 1024.0;
        throw Error(
            fmt::format("CUDA out of memory: {:.1f} MiB asked for while tensors hold {:.1f} MiB (peak "
                        "{:.1f} MiB); lower the batch size or the sequence length",
                        static_cast<double>(want) / MiB, static_cast<double>(stats.current) / MiB,
                        static_cast<double>(stats.peak) / MiB));
      }
      stats.reserved += want;
      ++stats.device_mallocs;
    }
    live[ptr] = size;
    stats.current += size;
    stats.peak = std::max(stats.peak, stats.current);
    return ptr;
  }

  void release(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = live.find(ptr);
    CAST_CHECK(it != live.end(), "CUDA allocator: release of a block it never handed out");
    free_blocks.insert({it->second, ptr});
    stats.current -= it->second;
    live.erase(it);
  }

  void release_locked() {
    for (auto& [size, block] : free_blocks) {
      cudaFree(block);
      stats.reserved -= size;
    }
    free_blocks.clear();
  }
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}
}  // namespace

MemoryStats memory_stats() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  return allocator().stats;
}
void reset_peak_memory() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  allocator().stats.peak = allocator().stats.current;
}
void release_cached_memory() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  allocator().release_locked();
}

cublasHandle_t cublas_handle() {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    return h;
  }();
  return handle;
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {  // no driver: no GPU, not a failure
    (void)cudaGetLastError();
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.name = prop.name;
    d.major = prop.major;
    d.minor = prop.minor;
    d.total_bytes = prop.totalGlobalMem;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_bytes = free_b;
    out.push_back(d);
  }
  if (count > 0) (void)cudaSetDevice(0);
  return out;
}

void synchronize() {
  CUDA_CHECK(cudaDeviceSynchronize());
  {
    std::lock_guard<std::mutex> lock(allocator().mutex);
    ++allocator().stats.synchronizations;
  }
  report_failed_checks();
}

namespace {
std::vector<std::string>* g_launch_log = nullptr;  // one test at a time sets it
}  // namespace

void set_launch_log(std::vector<std::string>* log) { g_launch_log = log; }

void record_launch(const char* name) {
  if (g_launch_log) g_launch_log->push_back(name);
}

double time_ms(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start));
  fn();
  CUDA_CHECK(cudaEventRecord(stop));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace cast::cuda

namespace cast::device_memory {

bool cuda_built() { return true; }
bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err == cudaSuccess && count > 0;
  }();
  return available;
}
void* allocate(size_t bytes) {
  CAST_CHECK(cuda_available(), "cuda device requested, but no CUDA GPU is available");
  return cuda::allocator().allocate(bytes);
}
void release(void* ptr, size_t) { cuda::allocator().release(ptr); }
void copy_to_device(void* dst, const void* src, size_t n) {
  CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  std::lock_guard<std::mutex> lock(cuda::allocator().mutex);
  ++cuda::allocator().stats.to_device;
}
void copy_to_host(void* dst, const void* src, size_t n) {
  CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  {
    std::lock_guard<std::mutex> lock(cuda::allocator().mutex);
    ++cuda::allocator().stats.to_host;
  }
  cuda::report_failed_checks();  // the device has finished every kernel launched so far
}
void copy_device_to_device(void* dst, const void* src, size_t n) {
  CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
}
void fill_bytes(void* dst, int value, size_t n) { CUDA_CHECK(cudaMemset(dst, value, n)); }

template <class W>
__global__ void fill_kernel(W* dst, W value, int64_t n) {
  CAST_KERNEL_LOOP(i, n) dst[i] = value;
}

void fill_elements(void* dst, uint64_t bits, size_t elem_bytes, size_t count) {
  CAST_CHECK(elem_bytes == 2 || elem_bytes == 4 || elem_bytes == 8, "fill: elements of {} bytes", elem_bytes);
  if (count == 0) return;
  const int64_t n = static_cast<int64_t>(count);
  if (elem_bytes == 2)
    CAST_LAUNCH(fill_kernel<uint16_t>, cuda::blocks_for(n), cuda::kThreads, 0, static_cast<uint16_t*>(dst),
                static_cast<uint16_t>(bits), n);
  else if (elem_bytes == 4)
    CAST_LAUNCH(fill_kernel<uint32_t>, cuda::blocks_for(n), cuda::kThreads, 0, static_cast<uint32_t*>(dst),
                static_cast<uint32_t>(bits), n);
  else CAST_LAUNCH(fill_kernel<uint64_t>, cuda::blocks_for(n), cuda::kThreads, 0, static_cast<uint64_t*>(dst), bits, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cast::device_memory
