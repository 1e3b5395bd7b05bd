#pragma once
// Marks small functions that both the CPU code and CUDA kernels call, so the math is written once.
#if defined(__CUDACC__)
#define CAST_HD __host__ __device__ __forceinline__
#else
#define CAST_HD inline
#endif
