#pragma once
// Shared memory through one accessor, so that the emulation (cuda/emulation/) can check every
// access for races and bounds; on a GPU it is a plain pointer.
//   CAST_SHARED_ARRAY(float, partial, 32);          // static: __shared__ float partial[32]
//   CAST_DYNAMIC_SHARED(float, tile, count);        // the launch's dynamic shared memory
// Kernels index it like an array: partial[i] = v; float x = partial[j]; and move four floats at
// once with tile.load4(i) / tile.store4(i, v) (i a multiple of 4: one 128-bit access).
#if defined(CAST_CUDA_EMULATION)
#include "cuda/emulation/shared_array.h"
#else
#include <cstdint>

namespace cast::cuda {

template <class T>
class SharedArray {
 public:
  __device__ SharedArray(T* data, int64_t size, const char*) : data_(data) { (void)size; }
  __device__ T& operator[](int64_t i) const { return data_[i]; }
  __device__ T atomic_add(int64_t i, T v) const { return atomicAdd(data_ + i, v); }
  // Four elements from i, a multiple of 4, in one 128-bit access (float arrays only).
  __device__ float4 load4(int i) const { return *reinterpret_cast<const float4*>(data_ + i); }
  __device__ void store4(int i, float4 v) const { *reinterpret_cast<float4*>(data_ + i) = v; }

 private:
  T* data_;
};

}  // namespace cast::cuda

#define CAST_SHARED_ARRAY(T, name, n) \
  __shared__ T name##_storage_[n];    \
  ::cast::cuda::SharedArray<T> name(name##_storage_, n, #name)

#define CAST_DYNAMIC_SHARED(T, name, count)                           \
  extern __shared__ __align__(16) unsigned char cast_dynamic_smem_[]; \
  ::cast::cuda::SharedArray<T> name(reinterpret_cast<T*>(cast_dynamic_smem_), count, #name)
#endif
