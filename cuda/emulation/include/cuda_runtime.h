#pragma once
// The CUDA language and runtime API as host C++, for the emulation build of cuda/*.cu
// (cuda/emulation/). Kernels are ordinary functions; launches go through cast::cuda::launch_kernel
// (cuda/launch.cuh), which runs them on emulated blocks of fiber threads; device memory is host
// memory. Only what the kernels and the runtime code use (or are expected to use) is supplied.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cuda/emulation/emulator.h"

#define CAST_CUDA_EMULATION_ACTIVE 1

// ---------------------------------------------------------------- qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __constant__ static
#define __launch_bounds__(...)
// Raw __shared__ declarations are shared by the block but unchecked; kernels declare shared
// memory through CAST_SHARED_ARRAY / CAST_DYNAMIC_SHARED (cuda/shared_memory.cuh) to be checked.
#define __shared__ static thread_local

// ---------------------------------------------------------------- built-in variables
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = ::cast::emu::Dim3;
// The 16-byte vector type of 128-bit loads and stores; as on a GPU, its address must be a
// multiple of 16 (UndefinedBehaviorSanitizer checks a misaligned one).
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

#define threadIdx (::cast::emu::current().thread_idx)
#define blockIdx (::cast::emu::current().block_idx)
#define blockDim (::cast::emu::current().block_dim)
#define gridDim (::cast::emu::current().grid_dim)
constexpr int warpSize = 32;

// ---------------------------------------------------------------- synchronisation
#define __syncthreads() ::cast::emu::barrier(__FILE__, __LINE__)
#define __syncwarp(...) ::cast::emu::cuda_syncwarp(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)

namespace cast::emu {

inline void cuda_syncwarp(const char* file, int line, unsigned mask = 0xffffffffu) {
  warp_collective(WarpOp::sync, mask, 0, 0, 32, file, line);
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp functions move at most 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <class T>
T from_bits(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
// The warp functions with their call site first, so the width keeps its default.
template <class T>
T shfl_at(const char* file, int line, unsigned mask, T v, int src, int width = 32) {
  return from_bits<T>(warp_collective(WarpOp::shfl, mask, to_bits(v), src, width, file, line));
}
template <class T>
T shfl_xor_at(const char* file, int line, unsigned mask, T v, int lane_mask, int width = 32) {
  return from_bits<T>(warp_collective(WarpOp::shfl_xor, mask, to_bits(v), lane_mask, width, file, line));
}
template <class T>
T shfl_down_at(const char* file, int line, unsigned mask, T v, unsigned delta, int width = 32) {
  return from_bits<T>(warp_collective(WarpOp::shfl_down, mask, to_bits(v), static_cast<int>(delta), width, file, line));
}
template <class T>
T shfl_up_at(const char* file, int line, unsigned mask, T v, unsigned delta, int width = 32) {
  return from_bits<T>(warp_collective(WarpOp::shfl_up, mask, to_bits(v), static_cast<int>(delta), width, file, line));
}
inline unsigned ballot_at(const char* file, int line, unsigned mask, int predicate) {
  return static_cast<unsigned>(warp_collective(WarpOp::ballot, mask, predicate != 0, 0, 32, file, line));
}
inline int any_at(const char* file, int line, unsigned mask, int predicate) {
  return static_cast<int>(warp_collective(WarpOp::any, mask, predicate != 0, 0, 32, file, line));
}
inline int all_at(const char* file, int line, unsigned mask, int predicate) {
  return static_cast<int>(warp_collective(WarpOp::all, mask, predicate != 0, 0, 32, file, line));
}

}  // namespace cast::emu

#define __shfl_sync(...) ::cast::emu::shfl_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) ::cast::emu::shfl_xor_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) ::cast::emu::shfl_down_at(__FILE__, __LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) ::cast::emu::shfl_up_at(__FILE__, __LINE__, __VA_ARGS__)
#define __ballot_sync(...) ::cast::emu::ballot_at(__FILE__, __LINE__, __VA_ARGS__)
#define __any_sync(...) ::cast::emu::any_at(__FILE__, __LINE__, __VA_ARGS__)
#define __all_sync(...) ::cast::emu::all_at(__FILE__, __LINE__, __VA_ARGS__)

// ---------------------------------------------------------------- atomics
// The blocks of a launch run one after another on one host thread and its threads are
// cooperative fibers, so a plain read-modify-write cannot be interleaved.
template <class T>
inline T atomicAdd(T* address, T v) {
  const T old = *address;
  *address = old + v;
  return old;
}
template <class T>
inline T atomicMax(T* address, T v) {
  const T old = *address;
  *address = old > v ? old : v;
  return old;
}
template <class T>
inline T atomicMin(T* address, T v) {
  const T old = *address;
  *address = old < v ? old : v;
  return old;
}
template <class T>
inline T atomicExch(T* address, T v) {
  const T old = *address;
  *address = v;
  return old;
}
template <class T>
inline T atomicCAS(T* address, T compare, T v) {
  const T old = *address;
  if (old == compare) *address = v;
  return old;
}

// Blocks run one after another: whatever a block wrote is seen by every later block.
inline void __threadfence() {}

// ---------------------------------------------------------------- math intrinsics
inline float __expf(float x) { return std::exp(x); }
// Rounded on their own, never contracted into a multiply-add (nor by the host compiler: the
// volatile result is a value it cannot see through)
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, 4);
  return x;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }

// ---------------------------------------------------------------- runtime API
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorIllegalAddress = 700,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;
struct CUevent_st;
using cudaEvent_t = CUevent_st*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int major, minor;
  int multiProcessorCount;
  int warpSize;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int maxThreadsPerBlock;
};

cudaError_t cudaMalloc(void** ptr, size_t bytes);
template <class T>
inline cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaFree(void* ptr);
// Mapped (zero-copy) host memory: the device writes into it directly. Here both sides share one
// address space, so the device pointer is the host pointer.
constexpr unsigned cudaHostAllocMapped = 2;
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned flags);
cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop);
cudaError_t cudaEventDestroy(cudaEvent_t event);

// Opting in to more than 48 KiB of dynamic shared memory for one kernel (up to 227 KiB on sm_90).
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
namespace cast::emu {
cudaError_t set_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value);
}
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attribute, int value) {
  return ::cast::emu::set_kernel_attribute(reinterpret_cast<const void*>(kernel), attribute, value);
}
namespace cast::emu {
// Counts of the runtime calls, for tests (host-device round trips, allocations).
struct RuntimeCounts {
  uint64_t mallocs = 0, frees = 0, to_device = 0, to_host = 0, device_to_device = 0, synchronizations = 0;
  size_t bytes_in_use = 0;
};
RuntimeCounts runtime_counts();
// Tests of running out of memory: cudaMalloc fails once the blocks it has handed out would
// exceed `bytes`, and cudaMemGetInfo reports it as the total (0: the host's memory, the default).
void set_device_memory_limit(size_t bytes);
// Tests of a failed kernel: every later runtime call returns `err` (cudaSuccess clears it), as a
// GPU does after an illegal address.
void set_sticky_error(cudaError_t err);
}  // namespace cast::emu
