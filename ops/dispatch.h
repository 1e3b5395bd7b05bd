#pragma once
// Device dispatch used by every op: a CUDA tensor runs the cuda/ version of the op and returns.
// Without CUDA the cuda/ call is not even compiled; a CUDA tensor cannot exist then anyway.
#include "tensor/tensor.h"

#ifdef CAST_WITH_CUDA
#define CAST_ON_CUDA(tensor, ...) \
  if ((tensor).is_cuda()) {       \
    __VA_ARGS__;                  \
    return;                       \
  }
#else
#define CAST_ON_CUDA(tensor, ...) \
  if ((tensor).is_cuda()) throw ::cast::Error("cuda tensor given, but cast was built without CUDA");
#endif

// An OpenMP pragma where `#pragma` cannot stand: inside a macro's arguments, such as the body
// a CAST_DISPATCH_FLOAT lambda runs. clang-format knows it as a statement (.clang-format).
#define CAST_OMP(text) _Pragma(text)
