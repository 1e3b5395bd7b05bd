#include "cuda/deferred_checks.h"

#include <mutex>
#include <vector>

#include "cuda/check.h"
#include "cuda/runtime.h"
#include "tensor/error.h"

namespace cast::cuda {

namespace {

struct Check {
  const char* op;
  int64_t lo, hi;
};

struct Registry {
  std::mutex mutex;
  std::vector<Check> pending;  // id i + 1 is pending[i]
  volatile unsigned long long* host_word = nullptr;
  unsigned long long* device_word = nullptr;
};

Registry& registry() {
  static Registry r;
  return r;
}

constexpr size_t kMostPending = 0xFFFF;  // ids fit 16 bits

// Raises the failure recorded in the word (if any); the caller holds the mutex.
void report_locked(Registry& r) {
  const unsigned long long word = r.host_word ? *r.host_word : 0ull;
  std::vector<Check> pending;
  pending.swap(r.pending);
  if (word == 0ull) return;
  *r.host_word = 0ull;
  const uint32_t id = static_cast<uint32_t>(word >> 48);
  const int64_t value = static_cast<int64_t>(word << 16) >> 16;  // the 48-bit value, sign-extended
  CAST_CHECK(id >= 1 && id <= pending.size(), "index check: a fault word names check {} of {} registered", id,
             pending.size());
  const Check& c = pending[id - 1];
  throw Error(
      fmt::format("{}: index out of range: {} found, allowed [{}, {}) (checked on the GPU, reported when the "
                  "host next waited for it)",
                  c.op, value, c.lo, c.hi));
}

}  // namespace

PendingCheck register_index_check(const char* op, int64_t lo, int64_t hi) {
  Registry& r = registry();
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    full = r.pending.size() >= kMostPending;
  }
  if (full) synchronize();  // reads and forgets the pending checks (and takes the mutex itself)
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.host_word) {
    void* host = nullptr;
    void* device = nullptr;
    CUDA_CHECK(cudaHostAlloc(&host, sizeof(unsigned long long), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
    r.host_word = static_cast<volatile unsigned long long*>(host);
    *r.host_word = 0ull;
    r.device_word = static_cast<unsigned long long*>(device);
  }
  r.pending.push_back({op, lo, hi});
  return {r.device_word, static_cast<uint32_t>(r.pending.size())};
}

void report_failed_checks() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  report_locked(r);
}

}  // namespace cast::cuda
