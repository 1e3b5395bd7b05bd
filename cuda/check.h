#pragma once
// Always-on checks for CUDA and cuBLAS calls; the error names the file and line that failed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "tensor/error.h"

#define CUDA_CHECK(call)                                                                                          \
  do {                                                                                                            \
    cudaError_t cast_err_ = (call);                                                                               \
    if (cast_err_ != cudaSuccess)                                                                                 \
      throw ::cast::Error(                                                                                        \
          fmt::format("CUDA error at {}:{}: {} ({})", __FILE__, __LINE__, cudaGetErrorString(cast_err_), #call)); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                         \
  do {                                                                                             \
    cublasStatus_t cast_st_ = (call);                                                              \
    if (cast_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
      throw ::cast::Error(fmt::format("cuBLAS error at {}:{}: status {} ({})", __FILE__, __LINE__, \
                                      static_cast<int>(cast_st_), #call));                         \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
