// Device memory when the project is built without CUDA: every call is an error.
#include "tensor/device_memory.h"

#include "tensor/error.h"

namespace cast::device_memory {

[[noreturn]] static void no_cuda() { throw Error("cuda device requested, but cast was built without CUDA"); }

bool cuda_built() { return false; }
bool cuda_available() { return false; }
void* allocate(size_t) { no_cuda(); }
void release(void*, size_t) {}
void copy_to_device(void*, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void copy_device_to_device(void*, const void*, size_t) { no_cuda(); }
void fill_bytes(void*, int, size_t) { no_cuda(); }
void fill_elements(void*, uint64_t, size_t, size_t) { no_cuda(); }

}  // namespace cast::device_memory
