#include "tensor/tensor.h"

#include <climits>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>
#include <fmt/ranges.h>

#include "tensor/device_memory.h"
#include "tensor/host_cache.h"
#include "tensor/philox.h"

namespace cast {

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

int64_t shape_numel(const Shape& s) {
  // Overflow-checked over the nonzero dimensions as well: [2^39, 2^39, 0] holds no element, but
  // it is no shape a file may declare.
  int64_t nonzero = 1;
  bool empty = false;
  for (int64_t d : s) {
    CAST_CHECK(d >= 0, "shape {}: negative dimension", shape_str(s));
    if (d == 0) {
      empty = true;
      continue;
    }
    CAST_CHECK(nonzero <= INT64_MAX / d, "shape {}: more than 2^63 elements", shape_str(s));
    nonzero *= d;
  }
  return empty ? 0 : nonzero;
}

// ---------------------------------------------------------------- storage
static std::atomic<size_t> g_host_current{0}, g_host_peak{0};

HostMemoryStats host_memory_stats() { return {g_host_current.load(), g_host_peak.load()}; }

size_t host_memory_total() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}
void reset_host_peak_memory() { g_host_peak = g_host_current.load(); }

// Sizes are rounded up to 64 bytes (aligned_alloc needs a multiple of the alignment).
Storage::Storage(size_t nbytes, Device dev) : bytes(std::max<size_t>(64, (nbytes + 63) / 64 * 64)), device(dev) {
  if (device == Device::cpu) {
    data = host_cache::allocate(bytes);
    const size_t now = g_host_current += bytes;
    size_t peak = g_host_peak.load();
    while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
    }
  } else {
    data = device_memory::allocate(bytes);
  }
}

Storage::~Storage() {
  if (device == Device::cpu) {
    host_cache::release(data, bytes);
    g_host_current -= bytes;
  } else {
    device_memory::release(data, bytes);
  }
}

static bool g_poison = false;  // see set_poison_new_tensors
static void fill_bytes(Tensor& t, int value);

// ---------------------------------------------------------------- construction
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) CAST_CHECK(d >= 0, "tensor: negative dimension in shape {}", shape_str(shape));
  CAST_CHECK(device == Device::cpu || dtype != DType::f64, "tensor: f64 is supported on the CPU only");
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  Tensor t(impl);
  // Poison: NaN for floats (bytes 0xFF), a large negative number for indices (bytes 0x80).
  if (g_poison) fill_bytes(t, is_floating(dtype) ? 0xFF : 0x80);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_zero();
  return t;
}

template <class T>
static void fill_host(Tensor& t, const std::vector<double>& v) {
  T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(v[i]);
}

// Builds a host tensor of `dtype` from doubles, then moves it to `device`.
static Tensor from_doubles(const std::vector<double>& v, const Shape& shape, DType dtype, Device device) {
  Tensor host = Tensor::empty(shape, dtype, Device::cpu);
  switch (dtype) {
    case DType::f32: fill_host<float>(host, v); break;
    case DType::f64: fill_host<double>(host, v); break;
    case DType::i32: fill_host<int32_t>(host, v); break;
    case DType::i64: fill_host<int64_t>(host, v); break;
    case DType::bf16:
      for (size_t i = 0; i < v.size(); ++i) host.data<bfloat16>()[i].bits = bf16_bits_of_double(v[i]);
      break;
  }
  return host.to(device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  if (device == Device::cpu) return from_doubles(std::vector<double>(shape_numel(shape), value), shape, dtype, device);
  // on the device: filled there, no copy from the host
  Tensor t = empty(shape, dtype, device);
  uint64_t bits = 0;
  auto pattern = [&](auto v) { std::memcpy(&bits, &v, sizeof(v)); };
  switch (dtype) {
    case DType::f32: pattern(static_cast<float>(value)); break;
    case DType::f64: pattern(value); break;
    case DType::i32: pattern(static_cast<int32_t>(value)); break;
    case DType::i64: pattern(static_cast<int64_t>(value)); break;
    case DType::bf16: pattern(bf16_bits_of(static_cast<float>(value))); break;
  }
  device_memory::fill_elements(t.raw_data(), bits, dtype_size(dtype), static_cast<size_t>(t.numel()));
  return t;
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  CAST_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "tensor: {} values do not fill shape {}",
             values.size(), shape_str(shape));
  Tensor host = empty(shape, dtype_of<T>(), Device::cpu);
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  return host.to(device);
}
template Tensor Tensor::from_vector(const std::vector<float>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<double>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int32_t>&, const Shape&, Device);
template Tensor Tensor::from_vector(const std::vector<int64_t>&, const Shape&, Device);

// Random tensors are drawn on the host from the counter-based stream, so both devices agree.
Tensor Tensor::uniform(const Shape& shape, uint64_t seed, uint64_t offset, double lo, double hi, DType dtype,
                       Device device) {
  std::vector<double> v(shape_numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = lo + (hi - lo) * philox::uniform(seed, offset + i);
  return from_doubles(v, shape, dtype, device);
}

Tensor Tensor::normal(const Shape& shape, uint64_t seed, uint64_t offset, double stddev, DType dtype, Device device) {
  std::vector<double> v(shape_numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = stddev * philox::normal(seed, offset + i);
  return from_doubles(v, shape, dtype, device);
}

// ---------------------------------------------------------------- metadata
static TensorImpl& checked(const std::shared_ptr<TensorImpl>& p) {
  if (!p) throw Error("tensor: use of an undefined tensor");
  return *p;
}
const Shape& Tensor::shape() const { return checked(impl_).shape; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).device; }

int64_t Tensor::dim(int axis) const {
  int a = normalize_axis("tensor.dim", axis, ndim());
  return shape()[a];
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined";
  return fmt::format("{}{} {}", dtype_name(dtype()), shape_str(shape()), device_name(device()));
}

void* Tensor::raw_data() { return const_cast<void*>(std::as_const(*this).raw_data()); }
const void* Tensor::raw_data() const {
  auto& t = checked(impl_);
  CAST_CHECK(t.storage, "tensor: the values of {} were released: a backward that declared it does not read them did",
             describe());
  return static_cast<const char*>(t.storage->data) + t.byte_offset;
}

template <class T>
T* Tensor::data() {
  CAST_CHECK(dtype() == dtype_of<T>(), "tensor: data<{}>() on a {} tensor", dtype_name(dtype_of<T>()), describe());
  return static_cast<T*>(raw_data());
}
template <class T>
const T* Tensor::data() const {
  CAST_CHECK(dtype() == dtype_of<T>(), "tensor: data<{}>() on a {} tensor", dtype_name(dtype_of<T>()), describe());
  return static_cast<const T*>(raw_data());
}
template float* Tensor::data<float>();
template double* Tensor::data<double>();
template int32_t* Tensor::data<int32_t>();
template int64_t* Tensor::data<int64_t>();
template const float* Tensor::data<float>() const;
template const double* Tensor::data<double>() const;
template const int32_t* Tensor::data<int32_t>() const;
template const int64_t* Tensor::data<int64_t>() const;
template bfloat16* Tensor::data<bfloat16>();
template const bfloat16* Tensor::data<bfloat16>() const;

// ---------------------------------------------------------------- copies
static void copy_bytes(void* dst, Device dd, const void* src, Device sd, size_t n) {
  if (n == 0) return;
  if (dd == Device::cpu && sd == Device::cpu) std::memcpy(dst, src, n);
  else if (dd == Device::cuda && sd == Device::cpu) device_memory::copy_to_device(dst, src, n);
  else if (dd == Device::cpu && sd == Device::cuda) device_memory::copy_to_host(dst, src, n);
  else device_memory::copy_device_to_device(dst, src, n);
}

void Tensor::copy_from(const Tensor& src) {
  CAST_CHECK(shape() == src.shape() && dtype() == src.dtype(), "tensor.copy_from: {} from {}", describe(),
             src.describe());
  copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor out = empty(shape(), dtype(), target);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  out.copy_from(*this);
  return out;
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = to(Device::cpu);
  std::vector<double> v(numel());
  switch (dtype()) {
    case DType::f32:
      for (size_t i = 0; i < v.size(); ++i) v[i] = host.data<float>()[i];
      break;
    case DType::f64:
      for (size_t i = 0; i < v.size(); ++i) v[i] = host.data<double>()[i];
      break;
    case DType::i32:
      for (size_t i = 0; i < v.size(); ++i) v[i] = host.data<int32_t>()[i];
      break;
    case DType::i64:
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(host.data<int64_t>()[i]);
      break;
    case DType::bf16:
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_value(host.data<bfloat16>()[i].bits);
      break;
  }
  return v;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  CAST_CHECK(device() == Device::cpu, "tensor.to({}): dtype conversion runs on the CPU; got {}", dtype_name(target),
             describe());
  return from_doubles(to_double_vector(), shape(), target, Device::cpu);
}

double Tensor::item() const {
  CAST_CHECK(numel() == 1, "tensor.item: expected one element, got {}", describe());
  return to_double_vector()[0];
}

static void fill_bytes(Tensor& t, int value) {
  if (t.device() == Device::cpu) {
    // a large buffer (a gradient created as zeros) is filled by every thread: one core's stores
    // reach about half the memory bandwidth
    constexpr size_t kChunk = size_t(1) << 20;
    const size_t bytes = t.nbytes(), chunks = (bytes + kChunk - 1) / kChunk;
    auto* p = static_cast<unsigned char*>(t.raw_data());
#pragma omp parallel for schedule(static) if (chunks > 2)
    for (size_t c = 0; c < chunks; ++c) std::memset(p + c * kChunk, value, std::min(kChunk, bytes - c * kChunk));
  } else {
    device_memory::fill_bytes(t.raw_data(), value, t.nbytes());
  }
}

void Tensor::fill_zero() { fill_bytes(*this, 0); }

void set_poison_new_tensors(bool on) { g_poison = on; }
bool poison_new_tensors() { return g_poison; }

Tensor Tensor::view(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      CAST_CHECK(infer < 0, "view: more than one -1 in {}", shape_str(new_shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    CAST_CHECK(known > 0 && numel() % known == 0, "view: cannot view {} as {}", describe(), shape_str(new_shape));
    s[infer] = numel() / known;
  }
  CAST_CHECK(shape_numel(s) == numel(), "view: cannot view {} as {}", describe(), shape_str(new_shape));
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = s;
  impl->requires_grad = false;
  impl->grad.reset();
  return Tensor(impl);
}

Tensor Tensor::slice0(int64_t index) const {
  CAST_CHECK(ndim() >= 1 && index >= 0 && index < shape()[0], "slice0: index {} outside {}", index, describe());
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape.erase(impl->shape.begin());
  impl->byte_offset += static_cast<size_t>(index) * static_cast<size_t>(shape_numel(impl->shape)) * dtype_size(dtype());
  impl->requires_grad = false;
  impl->grad.reset();
  return Tensor(impl);
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  CAST_CHECK(ndim() >= 1 && start >= 0 && length >= 0 && start + length <= shape()[0],
             "narrow0: rows [{}, {}) outside {}", start, start + length, describe());
  auto impl = std::make_shared<TensorImpl>(*impl_);
  const int64_t row = shape_numel(impl->shape) / std::max<int64_t>(impl->shape[0], 1);
  impl->shape[0] = length;
  impl->byte_offset += static_cast<size_t>(start) * static_cast<size_t>(row) * dtype_size(dtype());
  impl->requires_grad = false;
  impl->grad.reset();
  return Tensor(impl);
}

// ---------------------------------------------------------------- autograd fields
bool Tensor::requires_grad() const { return checked(impl_).requires_grad; }
Tensor& Tensor::set_requires_grad(bool value) {
  CAST_CHECK(!value || is_floating(dtype()), "tensor: only float tensors can require grad, got {}", describe());
  checked(impl_).requires_grad = value;
  return *this;
}
Tensor Tensor::grad() const { return Tensor(checked(impl_).grad); }
Tensor Tensor::grad_accumulator() {
  auto& t = checked(impl_);
  if (!t.grad) t.grad = zeros(t.shape, t.dtype, t.device).impl_;
  return Tensor(t.grad);
}
Tensor Tensor::grad_buffer(bool* fresh) {
  auto& t = checked(impl_);
  *fresh = !t.grad;
  if (!t.grad) t.grad = empty(t.shape, t.dtype, t.device).impl_;
  return Tensor(t.grad);
}
void Tensor::zero_grad() {
  if (checked(impl_).grad) Tensor(impl_->grad).fill_zero();
}
void Tensor::reset_grad() { checked(impl_).grad.reset(); }
void Tensor::set_grad(const Tensor& g) {
  CAST_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(),
             "tensor.set_grad: gradient {} does not match tensor {}", g.describe(), describe());
  checked(impl_).grad = g.impl_;
}

// ---------------------------------------------------------------- checks
void check_dtype(const char* op, const Tensor& t, DType expected, const char* what) {
  CAST_CHECK(t.defined(), "{}: {} is undefined", op, what);
  CAST_CHECK(t.dtype() == expected, "{}: {} must be {}, got {}", op, what, dtype_name(expected), t.describe());
}
void check_float(const char* op, const Tensor& t, const char* what) {
  CAST_CHECK(t.defined(), "{}: {} is undefined", op, what);
  CAST_CHECK(is_float(t.dtype()), "{}: {} must be a float tensor, got {}", op, what, t.describe());
}
void check_index(const char* op, const Tensor& t, const char* what) {
  CAST_CHECK(t.defined(), "{}: {} is undefined", op, what);
  CAST_CHECK(is_index(t.dtype()), "{}: {} must be an index tensor (i32/i64), got {}", op, what, t.describe());
}
void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  CAST_CHECK(a.device() == b.device(), "{}: tensors on different devices: {} and {}", op, a.describe(), b.describe());
}
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  CAST_CHECK(a.dtype() == b.dtype(), "{}: dtype mismatch: {} and {}", op, a.describe(), b.describe());
}
void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  CAST_CHECK(a.shape() == b.shape(), "{}: shape mismatch: {} and {}", op, a.describe(), b.describe());
}
void check_ndim(const char* op, const Tensor& t, int nd, const char* what) {
  CAST_CHECK(t.ndim() == nd, "{}: {} must have {} dims, got {}", op, what, nd, t.describe());
}
int normalize_axis(const char* op, int axis, int nd) {
  int a = axis < 0 ? axis + nd : axis;
  CAST_CHECK(a >= 0 && a < nd, "{}: axis {} out of range for {} dims", op, axis, nd);
  return a;
}

}  // namespace cast
