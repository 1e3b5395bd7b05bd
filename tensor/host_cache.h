#pragma once
// Host memory for tensors, kept for reuse. A training step frees and allocates the same sizes
// every step; from the C library each large block came fresh from mmap and was faulted in page
// by page (thousands of page faults a small step, a fifth of its time in the kernel). Freed
// blocks are kept by exact size up to a cap and handed out again; the GPU's allocator
// (cuda/runtime.cu) does the same for device memory.
//
// host_memory_stats() (tensor/tensor.h) still counts what tensors hold; what this cache keeps
// besides is cached_bytes(). Builds with AddressSanitizer keep nothing, so a use after free
// still shows.
#include <cstddef>

namespace cast::host_cache {

// 64-byte aligned memory of `bytes` (a multiple of 64); throws when the host has none
void* allocate(size_t bytes);
// gives a block from allocate() back: kept for the next allocate() of the same size (making
// room by freeing kept blocks of other sizes, largest first), or freed when over the limit
void release(void* ptr, size_t bytes) noexcept;

size_t cached_bytes();               // kept now, held by no tensor
size_t cache_limit();                // the most it keeps
void set_cache_limit(size_t bytes);  // 0 keeps nothing; frees what is over the new limit
void free_cached();                  // returns every kept block to the C library

}  // namespace cast::host_cache
