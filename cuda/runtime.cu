// Caching device allocator, device-memory services for tensor/, the cuBLAS handle.
#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"
#include "tensor/device_memory.h"

namespace cast::cuda {

namespace {
// Freed blocks are kept by exact (rounded) size and handed out again, so a training step that
// repeats the same shapes makes no cudaMalloc after the first one.
struct CachingAllocator {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;

  static size_t round(size_t bytes) { return bytes < 512 ? 512 : (bytes + 511) / 512 * 512; }

  void* allocate(size_t bytes) {
    bytes = round(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    void* ptr = nullptr;
    auto it = free_blocks.find(bytes);
    if (it != free_blocks.end() && !it->second.empty()) {
      ptr = it->second.back();
      it->second.pop_back();
    } else {
      cudaError_t err = cudaMalloc(&ptr, bytes);
      if (err != cudaSuccess) {  // give the cache back to the driver and try once more
        (void)cudaGetLastError();
        release_locked();
        CUDA_CHECK(cudaMalloc(&ptr, bytes));
      }
      stats.reserved += bytes;
      ++stats.device_mallocs;
    }
    stats.current += bytes;
    stats.peak = std::max(stats.peak, stats.current);
    return ptr;
  }

  void release(void* ptr, size_t bytes) {
    bytes = round(bytes);
    std::lock_guard<std::mutex> lock(mutex);
    free_blocks[bytes].push_back(ptr);
    stats.current -= bytes;
  }

  void release_locked() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) {
        cudaFree(p);
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

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

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
void release(void* ptr, size_t bytes) { cuda::allocator().release(ptr, bytes); }
void copy_to_device(void* dst, const void* src, size_t n) { CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice)); }
void copy_to_host(void* dst, const void* src, size_t n) { CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost)); }
void copy_device_to_device(void* dst, const void* src, size_t n) {
  CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
}
void fill_bytes(void* dst, int value, size_t n) { CUDA_CHECK(cudaMemset(dst, value, n)); }

}  // namespace cast::device_memory
