#pragma once
// The CUDA runtime services: the caching allocator, the cuBLAS handle, device facts.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <cublas_v2.h>

namespace cast::cuda {

struct MemoryStats {
  size_t current = 0;         // bytes handed out to tensors now
  size_t peak = 0;            // most bytes handed out at once since the last reset
  size_t reserved = 0;        // bytes held from cudaMalloc (in use + cached)
  size_t device_mallocs = 0;  // cudaMalloc calls so far
  // Transfers and waits so far: each host<->device copy blocks the host until the GPU is done.
  size_t to_device = 0, to_host = 0, synchronizations = 0;
};
MemoryStats memory_stats();
void reset_peak_memory();
void release_cached_memory();

cublasHandle_t cublas_handle();

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;
  size_t total_bytes = 0, free_bytes = 0;
};
std::vector<DeviceInfo> devices();  // empty when there is no usable GPU
void synchronize();
// Milliseconds `fn` takes on the GPU, between two CUDA events on the default stream.
double time_ms(const std::function<void()>& fn);
// Where set (by a test; nullptr: off), every kernel launch appends its kernel's name to `log`:
// which variant a dispatch chose is then checked on the GPU and in the emulation alike.
void set_launch_log(std::vector<std::string>* log);

}  // namespace cast::cuda
