#pragma once
// The emulation's shared-memory accessor: every read and write of an element is reported to the
// block's checker (bounds, and races between barriers) before it happens.
#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/emulation/emulator.h"
#include "tensor/error.h"

namespace cast::cuda {

template <class T>
class SharedRef {
 public:
  SharedRef(T* base, int64_t i, int64_t size, const char* name) : base_(base), i_(i), size_(size), name_(name) {}
  operator T() const {  // a read
    emu::shared_access(base_, i_, size_, emu::SharedAccess::read, name_);
    return base_[i_];
  }
  const SharedRef& operator=(const T& v) const {  // a write
    emu::shared_access(base_, i_, size_, emu::SharedAccess::write, name_);
    base_[i_] = v;
    return *this;
  }
  const SharedRef& operator=(const SharedRef& other) const { return *this = static_cast<T>(other); }
  const SharedRef& operator+=(const T& v) const { return *this = static_cast<T>(*this) + v; }
  const SharedRef& operator-=(const T& v) const { return *this = static_cast<T>(*this) - v; }
  const SharedRef& operator*=(const T& v) const { return *this = static_cast<T>(*this) * v; }

 private:
  T* base_;
  int64_t i_, size_;
  const char* name_;
};

template <class T>
class SharedArray {
 public:
  SharedArray(T* data, int64_t size, const char* name) : data_(data), size_(size), name_(name) {}
  SharedRef<T> operator[](int64_t i) const { return SharedRef<T>(data_, i, size_, name_); }
  // atomicAdd on element i: atomic updates by several threads are no race with each other
  T atomic_add(int64_t i, T v) const {
    emu::shared_access(data_, i, size_, emu::SharedAccess::atomic, name_);
    const T old = data_[i];
    data_[i] = old + v;
    return old;
  }
  // Four elements in one 128-bit access: each checked as a read (or write), and the index
  // must be a multiple of 4, as a GPU's aligned vector access requires.
  float4 load4(int64_t i) const {
    check_aligned(i);
    float4 v;
    v.x = (*this)[i], v.y = (*this)[i + 1], v.z = (*this)[i + 2], v.w = (*this)[i + 3];
    return v;
  }
  void store4(int64_t i, float4 v) const {
    check_aligned(i);
    (*this)[i] = v.x, (*this)[i + 1] = v.y, (*this)[i + 2] = v.z, (*this)[i + 3] = v.w;
  }

 private:
  void check_aligned(int64_t i) const {
    CAST_CHECK(i % 4 == 0 && reinterpret_cast<uintptr_t>(data_) % 16 == 0,
               "CUDA emulation: 128-bit access to shared '{}' at element {}, not 16-byte aligned", name_, i);
  }
  T* data_;
  int64_t size_;
  const char* name_;
};

// The launch's dynamic shared memory as `count` elements of T (checked against its size).
template <class T>
T* dynamic_shared_as(int64_t count, const char* name) {
  CAST_CHECK(static_cast<size_t>(count) * sizeof(T) <= emu::dynamic_shared_bytes(),
             "CUDA emulation: dynamic shared memory '{}' of {} bytes exceeds the launch's {} bytes", name,
             static_cast<size_t>(count) * sizeof(T), emu::dynamic_shared_bytes());
  return static_cast<T*>(emu::dynamic_shared_memory());
}

}  // namespace cast::cuda

// Shared by the threads of a block: blocks run one after another on one host thread.
#define CAST_SHARED_ARRAY(T, name, n)       \
  static thread_local T name##_storage_[n]; \
  ::cast::cuda::SharedArray<T> name(name##_storage_, n, #name)

#define CAST_DYNAMIC_SHARED(T, name, count) \
  ::cast::cuda::SharedArray<T> name(::cast::cuda::dynamic_shared_as<T>(count, #name), count, #name)
