#pragma once
// The few device-memory services tensor/ needs. cuda/ implements them when CUDA is built;
// tensor/device_memory_none.cpp implements them otherwise (each throws a clear error).
#include <cstddef>
#include <cstdint>

namespace cast::device_memory {

bool cuda_built();             // compiled with CUDA support
bool cuda_available();         // CUDA built and at least one GPU with a working driver
void* allocate(size_t bytes);  // from the caching allocator
void release(void* ptr, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_device_to_device(void* dst, const void* src, size_t bytes);
void fill_bytes(void* dst, int value, size_t bytes);  // like memset
// count elements of elem_bytes (4 or 8) set to the low elem_bytes of `bits`, on the device (no copy)
void fill_elements(void* dst, uint64_t bits, size_t elem_bytes, size_t count);

}  // namespace cast::device_memory
