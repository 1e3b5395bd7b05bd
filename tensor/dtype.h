#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tensor/bf16.h"
#include "tensor/error.h"

namespace cast {

// f32 is used everywhere; f64 exists on the CPU for gradient checks; i32/i64 hold indices; bf16
// is a storage dtype (tensor/bf16.h), made and read by ops::convert, which no other op computes in.
enum class DType : uint8_t { f32, f64, i32, i64, bf16 };
enum class Device : uint8_t { cpu, cuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bf16: return 2;
  }
  return 0;
}
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bf16: return "bf16";
  }
  return "?";
}
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }
inline bool is_float(DType t) { return t == DType::f32 || t == DType::f64; }
inline bool is_index(DType t) { return t == DType::i32 || t == DType::i64; }
// A dtype whose tensors may carry gradients: the compute floats and bf16.
inline bool is_floating(DType t) { return is_float(t) || t == DType::bf16; }

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::bf16;
}

// Runs `body` with T bound to float or double according to a runtime dtype.
#define CAST_DISPATCH_FLOAT(dtype, opname, ...)                                                                     \
  [&] {                                                                                                             \
    switch (dtype) {                                                                                                \
      case ::cast::DType::f32: {                                                                                    \
        using T = float;                                                                                            \
        return __VA_ARGS__();                                                                                       \
      }                                                                                                             \
      case ::cast::DType::f64: {                                                                                    \
        using T = double;                                                                                           \
        return __VA_ARGS__();                                                                                       \
      }                                                                                                             \
      default:                                                                                                      \
        throw ::cast::Error(fmt::format("{}: expected a float tensor, got {}", opname, ::cast::dtype_name(dtype))); \
    }                                                                                                               \
  }()

// Same for integer index tensors (I = int32_t or int64_t).
#define CAST_DISPATCH_INDEX(dtype, opname, ...)                                                                \
  [&] {                                                                                                        \
    switch (dtype) {                                                                                           \
      case ::cast::DType::i32: {                                                                               \
        using I = int32_t;                                                                                     \
        return __VA_ARGS__();                                                                                  \
      }                                                                                                        \
      case ::cast::DType::i64: {                                                                               \
        using I = int64_t;                                                                                     \
        return __VA_ARGS__();                                                                                  \
      }                                                                                                        \
      default:                                                                                                 \
        throw ::cast::Error(                                                                                   \
            fmt::format("{}: expected an index tensor (i32/i64), got {}", opname, ::cast::dtype_name(dtype))); \
    }                                                                                                          \
  }()

}  // namespace cast
