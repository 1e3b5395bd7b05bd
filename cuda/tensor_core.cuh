#pragma once
// The tensor-core instructions the flash kernels use, one function each, with the PTX ISA's
// fragment layouts written down once here. On a GPU each is one inline PTX instruction; in the
// emulation build (cuda/emulation/tensor_core.cpp) each is a model of that instruction over the
// registers of the whole warp, so a kernel that holds a fragment in the wrong lane computes a
// wrong result in the tests as it would on the GPU.
//
// A warp's lane is (g, t) = (lane / 4, lane % 4). The fragments (PTX ISA, "Matrix Fragments for
// mma.m16n8k8 / m16n8k16"), with C and D of both shapes alike:
//   C, D (16×8 f32)      c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)
//   m16n8k8, TF32:   A (16×8)   a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4)
//                    B (8×8)    b0 (k t, n g)  b1 (k t+4, n g)
//   m16n8k16, BF16:  A (16×16)  a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//                    B (16×8)   b0 (k 2t..2t+1, n g)  b1 (k 2t+8..2t+9, n g)
// (a BF16 register holds two elements, the lower column or k in its lower half).
//
// ldmatrix .x4 loads four 8×8 matrices of 16-bit elements (8 rows of 16 bytes each): lane i
// gives the address of row i % 8 of matrix i / 8, and register m of lane (g, t) receives row g,
// elements 2t and 2t+1 of matrix m; with .trans, elements (2t, g) and (2t+1, g). On 32-bit
// data a 16-byte row is 4 elements and register m receives element (g, t): the TF32 A and B
// layouts above.
//
// cp.async copies 16 bytes from global to shared memory without passing through registers; a
// copy is complete only after cp_async_wait<n>() has left at most n newer committed groups
// pending, and visible to other threads only after a barrier that follows it.
#include <cstdint>
#include <cstring>

#include "cuda/shared_memory.cuh"

#if !defined(CAST_CUDA_EMULATION)
#include <cuda_bf16.h>
#endif

namespace cast::cuda::tc {

#if defined(CAST_CUDA_EMULATION)
// ---------------------------------------------------------------- the emulated instructions
uint32_t to_tf32(float x);                // cvt.rna.tf32.f32
uint32_t pack_bf16(float lo, float hi);   // cvt.rn.bf16x2.f32: two round-to-nearest-even halves
uint16_t to_bf16(float x);                // one, as its 16 bits
float tf32_value(uint32_t bits);          // what the tensor core multiplies: the top 19 bits
float ex2_approx(float x);                // ex2.approx.ftz.f32: 2^x (the model: exact, rounded once)
void mma_tf32_at(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char* file, int line);
void mma_bf16_at(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char* file, int line);
void ldmatrix_x4_at(uint32_t (&r)[4], const uint32_t (&row)[4], bool trans, const char* file, int line);

#define CAST_TC_HERE __FILE__, __LINE__
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_tf32_at(d, a, b, CAST_TC_HERE);
}
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_bf16_at(d, a, b, CAST_TC_HERE);
}

// Each lane reads its own 16-byte row through the checked accessor, then the warp exchanges.
template <class T, bool Trans>
void ldmatrix_x4_impl(uint32_t (&r)[4], const SharedArray<T>& smem, int64_t index) {
  static_assert(16 % sizeof(T) == 0, "ldmatrix rows are 16 bytes");
  constexpr int per_row = 16 / sizeof(T);
  CAST_CHECK(index % per_row == 0, "CUDA emulation: ldmatrix row at element {} of a shared array is not 16-byte aligned",
             index);
  T row[per_row];
  for (int i = 0; i < per_row; ++i) row[i] = smem[index + i];
  uint32_t words[4];
  std::memcpy(words, row, 16);
  ldmatrix_x4_at(r, words, Trans, CAST_TC_HERE);
}
template <class T>
void ldmatrix_x4(uint32_t (&r)[4], const SharedArray<T>& smem, int64_t index) {
  ldmatrix_x4_impl<T, false>(r, smem, index);
}
template <class T>
void ldmatrix_x4_trans(uint32_t (&r)[4], const SharedArray<T>& smem, int64_t index) {
  ldmatrix_x4_impl<T, true>(r, smem, index);
}

// The 16 bytes are read now (the inputs of a kernel do not change while it runs) and written
// into shared memory when this thread waits for their group. The race checker sees the write at
// the issue as well (each element rewritten with its own value): on a GPU the copy may land at
// once, so another thread's read of the destination since the last barrier is a race even when
// the data here arrives later.
template <class T>
void cp_async16(const SharedArray<T>& smem, int64_t index, const void* src, bool valid) {
  constexpr int per_row = 16 / sizeof(T);
  CAST_CHECK(index % per_row == 0 && (!valid || reinterpret_cast<uintptr_t>(src) % 16 == 0),
             "CUDA emulation: cp.async of 16 bytes to element {} from {}: not 16-byte aligned", index, src);
  for (int i = 0; i < per_row; ++i) smem[index + i] = static_cast<T>(smem[index + i]);
  T data[per_row] = {};
  if (valid) std::memcpy(data, src, 16);
  emu::async_copy_issue([smem, index, data]() {
    for (int i = 0; i < per_row; ++i) smem[index + i] = data[i];
  });
}
inline void cp_async_commit() { emu::async_copy_commit(); }

// Two adjacent floats in one 8-byte load: p must be 8-byte aligned.
inline void load_pair(float (&v)[2], const float* p) {
  CAST_CHECK(reinterpret_cast<uintptr_t>(p) % 8 == 0, "CUDA emulation: 8-byte load from {}: not 8-byte aligned",
             static_cast<const void*>(p));
  v[0] = p[0], v[1] = p[1];
}
template <int N>
void cp_async_wait() {
  emu::async_copy_wait(N);
}

#else
// ---------------------------------------------------------------- the GPU's instructions
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x, the lower half, from lo
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint16_t to_bf16(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
// 2^x in one MUFU instruction, relative error about 2^-22; 2^−∞ = 0, NaN stays NaN, results
// below FP32's normal range are 0.
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <class T>
__device__ __forceinline__ uint32_t shared_address(const SharedArray<T>& smem, int64_t index) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(&smem[index]));
}
template <class T>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const SharedArray<T>& smem, int64_t index) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem, index)));
}
template <class T>
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const SharedArray<T>& smem, int64_t index) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(smem, index)));
}

// 16 bytes from src, or 16 zero bytes where !valid (src is then not read).
template <class T>
__device__ __forceinline__ void cp_async16(const SharedArray<T>& smem, int64_t index, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(smem, index)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Two adjacent floats in one 8-byte load: p must be 8-byte aligned.
__device__ __forceinline__ void load_pair(float (&v)[2], const float* p) {
  const float2 x = *reinterpret_cast<const float2*>(p);
  v[0] = x.x, v[1] = x.y;
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif

}  // namespace cast::cuda::tc
