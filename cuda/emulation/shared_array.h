#pragma once
// The emulation's shared-memory accessor: every read and write of an element is reported to the
// block's checker (bounds, and races between barriers) before it happens.
#include <cstdint>

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

 private:
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
#define CAST_SHARED_ARRAY(T, name, n)          \
  static thread_local T name##_storage_[n];    \
  ::cast::cuda::SharedArray<T> name(name##_storage_, n, #name)

#define CAST_DYNAMIC_SHARED(T, name, count) \
  ::cast::cuda::SharedArray<T> name(::cast::cuda::dynamic_shared_as<T>(count, #name), count, #name)
