// The CUDA runtime and cuBLAS calls of the emulation: device memory is host memory, copies
// are memcpy, streams and events are host-side markers, sgemm is a loop on the CPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cblas.h>

#include <cstring>
#include <vector>

#include "cuda/tensor_core.cuh"

#include "tensor/tensor.h"

#include <chrono>
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <map>
#include <unordered_map>

namespace {

std::mutex g_mutex;
std::map<const char*, size_t> g_allocations;       // live cudaMalloc blocks, by address
std::map<const char*, size_t> g_mapped;            // live cudaHostAlloc blocks (mapped host memory)
std::unordered_map<const void*, size_t> g_opt_in;  // kernels' dynamic shared memory opt-ins
cudaError_t g_sticky = cudaSuccess;                // set by tests: a failed kernel's error
cast::emu::RuntimeCounts g_counts;
thread_local cudaError_t g_last_error = cudaSuccess;

cudaError_t fail(cudaError_t err) {
  g_last_error = err;
  return err;
}

size_t g_memory_limit = 0;  // 0: the host's memory

// The emulated device's memory is the host's (16 GiB where /proc/meminfo cannot be read), or
// the limit a test set.
size_t host_memory() {
  if (g_memory_limit) return g_memory_limit;
  const size_t total = cast::host_memory_total();
  return total ? total : size_t{16} << 30;
}

void count_copy(cudaMemcpyKind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (kind == cudaMemcpyHostToDevice) ++g_counts.to_device;
  else if (kind == cudaMemcpyDeviceToHost) ++g_counts.to_host;
  else if (kind == cudaMemcpyDeviceToDevice) ++g_counts.device_to_device;
}

struct Event {
  std::chrono::steady_clock::time_point when;
};

}  // namespace

namespace cast::emu {
RuntimeCounts runtime_counts() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_counts;
}
void set_device_memory_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_memory_limit = bytes;
}
void set_sticky_error(cudaError_t err) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sticky = err;
}

cudaError_t set_kernel_attribute(const void* kernel, cudaFuncAttribute attribute, int value) {
  constexpr int kMaxOptIn = 227 * 1024;  // sm_90's most dynamic shared memory per block
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > kMaxOptIn)
    return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_opt_in[kernel] = static_cast<size_t>(value);
  return cudaSuccess;
}

size_t max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_opt_in.find(kernel);
  return std::max<size_t>(48 * 1024, it == g_opt_in.end() ? 0 : it->second);
}

namespace {
// Whether p lies in one of `blocks` or one past its end (a pointer to an empty tensor's end).
bool inside(const std::map<const char*, size_t>& blocks, const char* p) {
  auto it = blocks.upper_bound(p);
  if (it == blocks.begin()) return false;
  --it;
  return p <= it->first + it->second;
}
}  // namespace

void check_kernel_pointer(const char* kernel_name, int argument, const void* pointer) {
  if (!pointer) return;
  const char* p = static_cast<const char*>(pointer);
  std::lock_guard<std::mutex> lock(g_mutex);
  CAST_CHECK(inside(g_allocations, p) || inside(g_mapped, p),
             "CUDA emulation: kernel {} argument {} is the address {}, which is not device memory (not from "
             "cudaMalloc or mapped host memory): a GPU would fault on it",
             kernel_name, argument, pointer);
}
}  // namespace cast::emu

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_sticky != cudaSuccess) return fail(g_sticky);
    if (g_memory_limit && g_counts.bytes_in_use + bytes > g_memory_limit) return fail(cudaErrorMemoryAllocation);
  }
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0));
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[static_cast<const char*>(p)] = bytes;
  ++g_counts.mallocs;
  g_counts.bytes_in_use += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(static_cast<const char*>(ptr));
  if (it == g_allocations.end()) return fail(cudaErrorInvalidDevicePointer);
  g_counts.bytes_in_use -= it->second;
  g_allocations.erase(it);
  ++g_counts.frees;
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0));
  if (!*ptr) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_mapped[static_cast<const char*>(*ptr)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned) {
  if (!device_ptr || !host_ptr) return fail(cudaErrorInvalidValue);
  *device_ptr = host_ptr;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_mapped.erase(static_cast<const char*>(ptr));
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (g_sticky != cudaSuccess) return fail(g_sticky);
  if (bytes && (!dst || !src)) return fail(cudaErrorInvalidValue);
  if (bytes) std::memmove(dst, src, bytes);
  count_copy(kind);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes && !dst) return fail(cudaErrorInvalidValue);
  if (bytes) std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) { return cudaMemset(dst, value, bytes); }

cudaError_t cudaGetLastError() {
  if (g_sticky != cudaSuccess) return g_sticky;  // a sticky error is never cleared
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_sticky != cudaSuccess ? g_sticky : g_last_error; }

const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "invalid device ordinal";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;  // the emulated device
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "CUDA emulation on the CPU", sizeof(prop->name) - 1);
  prop->totalGlobalMem = host_memory();
  prop->major = 9, prop->minor = 0, prop->multiProcessorCount = 1, prop->warpSize = 32;
  prop->sharedMemPerBlock = 48 * 1024, prop->maxThreadsPerBlock = 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;  // sm_90's, as max_dynamic_shared allows
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = host_memory();
  std::lock_guard<std::mutex> lock(g_mutex);
  *free_bytes = *total_bytes > g_counts.bytes_in_use ? *total_bytes - g_counts.bytes_in_use : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts.synchronizations;
  return g_sticky;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaDeviceSynchronize(); }
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = reinterpret_cast<cudaStream_t>(new char);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  reinterpret_cast<Event*>(event)->when = std::chrono::steady_clock::now();  // work before it has finished
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaDeviceSynchronize(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(reinterpret_cast<Event*>(stop)->when -
                                                 reinterpret_cast<Event*>(start)->when)
            .count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}

// ---------------------------------------------------------------- cuBLAS
struct cublasContext {
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  handle->mode = mode;  // TF32 is not emulated: products stay in fp32
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }

// Column-major: C (m, n) = alpha op(A) op(B) + beta C, A element (i, p) at a[i + p·lda] (or its
// transpose), with cuBLAS's rule that beta = 0 never reads C. cuBLAS is a library, not one of
// our kernels: the CPU BLAS computes each product (fp32, as cuBLAS without TF32), which keeps
// the emulated training steps fast enough to test.
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb, int m,
                                         int n, int k, const float* alpha, const float* a, int lda, long long stride_a,
                                         const float* b, int ldb, long long stride_b, const float* beta, float* c,
                                         int ldc, long long stride_c, int batch) {
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  // With k = 0 cuBLAS does not promise to write C: the emulation takes the strictest reading
  // and leaves C as it was, so a caller that relies on C = beta C shows up in the tests.
  if (k == 0 || m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  for (int bi = 0; bi < batch; ++bi) {
    float* cb = c + bi * stride_c;
    if (*beta == 0.f)  // never read C (it may hold NaN)
      for (int j = 0; j < n; ++j)
        std::fill(cb + static_cast<long long>(j) * ldc, cb + static_cast<long long>(j) * ldc + m, 0.f);
    cblas_sgemm(CblasColMajor, transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, *alpha, a + bi * stride_a, lda,
                b + bi * stride_b, ldb, *beta, cb, ldc);
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* a, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* b, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* c, cudaDataType_t c_type,
                                          int ldc, long long stride_c, int batch, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  const bool bf16_operands = a_type == CUDA_R_16BF && b_type == CUDA_R_16BF && compute == CUBLAS_COMPUTE_32F;
  const bool f32_operands = a_type == CUDA_R_32F && b_type == CUDA_R_32F &&
                            (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                             compute == CUBLAS_COMPUTE_32F_FAST_16BF);
  if (!(bf16_operands || f32_operands) || c_type != CUDA_R_32F) return CUBLAS_STATUS_INVALID_VALUE;
  const int a_cols = transa == CUBLAS_OP_N ? k : m, b_cols = transb == CUBLAS_OP_N ? n : k;
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (batch < 0 || a_cols < 0 || b_cols < 0) return CUBLAS_STATUS_INVALID_VALUE;
  // the operands as the tensor cores take them: an FP32 copy of each (column-major, rows × cols
  // with columns ld apart), rounded as the compute type says or widened from BF16, no element
  // past the last one cuBLAS reads: a matrix that is a slice of a wider one (a head's columns of a
  // weight) may end before its last column's ld does
  const auto rounded = [&](const void* x, int ld, int rows, int cols, long long stride) {
    const long long n_elements =
        batch == 0 || rows == 0 || cols == 0
            ? 0
            : stride * (batch - 1) + static_cast<long long>(ld) * (cols - 1) + rows;
    std::vector<float> copy(std::max(0LL, n_elements));
    if (bf16_operands) {
      const auto* src = static_cast<const uint16_t*>(x);
      for (size_t i = 0; i < copy.size(); ++i) copy[i] = cast::bf16_value(src[i]);
      return copy;
    }
    std::memcpy(copy.data(), x, copy.size() * sizeof(float));
    for (float& v : copy) {
      if (compute == CUBLAS_COMPUTE_32F_FAST_TF32) v = cast::cuda::tc::tf32_value(cast::cuda::tc::to_tf32(v));
      else if (compute == CUBLAS_COMPUTE_32F_FAST_16BF) v = cast::bf16_value(cast::cuda::tc::to_bf16(v));
    }
    return copy;
  };
  const std::vector<float> ra = rounded(a, lda, a_rows, a_cols, stride_a), rb = rounded(b, ldb, b_rows, b_cols, stride_b);
  return cublasSgemmStridedBatched(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), ra.data(), lda,
                                   stride_a, rb.data(), ldb, stride_b, static_cast<const float*>(beta),
                                   static_cast<float*>(c), ldc, stride_c, batch);
}
