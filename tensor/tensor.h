#pragma once
// Tensor: a shared handle to a shape, a dtype, a device and contiguous storage.
// Every tensor is contiguous; `view` reshapes without copying (the storage is shared).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/error.h"

namespace cast {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Owns one allocation on one device. Freed when the last tensor using it dies.
struct Storage {
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::cpu;
};

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- construction ---
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device = Device::cpu);
  // Uniform in [lo, hi) and standard normal draws from the counter-based RNG:
  // element i uses counter (offset + i), so CPU and CUDA give the same numbers.
  static Tensor uniform(const Shape& shape, uint64_t seed, uint64_t offset, double lo = 0.0, double hi = 1.0,
                        DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor normal(const Shape& shape, uint64_t seed, uint64_t offset, double stddev = 1.0,
                       DType dtype = DType::f32, Device device = Device::cpu);

  // --- metadata ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int ndim() const { return static_cast<int>(shape().size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device() == Device::cuda; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  std::string describe() const;  // "f32[2, 3] cpu"

  // --- data access (checks the dtype) ---
  template <class T>
  T* data();
  template <class T>
  const T* data() const;
  void* raw_data();
  const void* raw_data() const;

  // --- copies and views ---
  Tensor to(Device device) const;  // copy (or self when already there)
  Tensor to(DType dtype) const;    // converted copy (CPU only)
  Tensor clone() const;
  Tensor view(const Shape& shape) const;                // same storage, no autograd; one dim may be -1
  Tensor slice0(int64_t index) const;                   // element `index` of the first dim: a view, no autograd
  Tensor narrow0(int64_t start, int64_t length) const;  // rows [start, start + length): a view, no autograd
  void copy_from(const Tensor& src);                    // same shape and dtype, any devices
  void fill_zero();
  std::vector<double> to_double_vector() const;  // any dtype, any device
  double item() const;                           // one-element tensor

  // --- autograd ---
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value = true);
  Tensor grad() const;        // undefined when no gradient has arrived
  Tensor grad_accumulator();  // the gradient buffer, created as zeros on first use
  // The gradient buffer for a backward that writes every element of it: when none exists yet it
  // is created uninitialised and *fresh is set (the caller must overwrite it, beta = 0 in a
  // product), which saves zero-filling a buffer only to add into it; else *fresh is cleared.
  Tensor grad_buffer(bool* fresh);
  void zero_grad();
  void reset_grad();
  void set_grad(const Tensor& g);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same_as(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  std::shared_ptr<Storage> storage;
  size_t byte_offset = 0;  // a view may start inside its storage
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
};

// Host memory held by tensors now and at most since the last reset (benchmarks report it).
struct HostMemoryStats {
  size_t current = 0, peak = 0;
};
HostMemoryStats host_memory_stats();
// The machine's total memory from /proc/meminfo, or 0 where it cannot be read.
size_t host_memory_total();
void reset_host_peak_memory();

// Tests turn this on so that an op that fails to write part of its output shows NaN
// (floats) or an invalid index (integers) instead of stale memory.
void set_poison_new_tensors(bool on);
bool poison_new_tensors();

// Check helpers used at op boundaries; each message names the op.
void check_dtype(const char* op, const Tensor& t, DType expected, const char* what);
void check_float(const char* op, const Tensor& t, const char* what);
void check_index(const char* op, const Tensor& t, const char* what);
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
void check_same_shape(const char* op, const Tensor& a, const Tensor& b);
void check_ndim(const char* op, const Tensor& t, int ndim, const char* what);
int normalize_axis(const char* op, int axis, int ndim);

}  // namespace cast
