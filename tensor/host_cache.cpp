#include "tensor/host_cache.h"

#include <sys/resource.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "tensor/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define CAST_HOST_CACHE_KEEPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CAST_HOST_CACHE_KEEPS 0
#endif
#endif
#ifndef CAST_HOST_CACHE_KEEPS
#define CAST_HOST_CACHE_KEEPS 1
#endif

namespace cast::host_cache {

namespace {

// Exact sizes, not size classes: tensors report the bytes they hold (host_memory_stats), and a
// training step asks for the same sizes every step, so exact sizes are reused all the same.
struct Cache {
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // size -> kept blocks
  size_t cached = 0;
  // 1 GiB: more than any step of the presets frees at once (the Text step at N 4096 peaks
  // near 600 MiB), and little on a machine that trains such models.
  size_t limit = CAST_HOST_CACHE_KEEPS ? size_t{1} << 30 : 0;

  // frees kept blocks, largest sizes first, until at most `target` bytes are kept
  void trim_locked(size_t target) {
    while (cached > target) {
      auto largest = free_blocks.begin();
      for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
        if (it->first > largest->first) largest = it;
      for (void* p : largest->second) std::free(p);
      cached -= largest->first * largest->second.size();
      free_blocks.erase(largest);
    }
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: tensors in static objects free after main
  return *c;
}

}  // namespace

void* allocate(size_t bytes) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.find(bytes);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= bytes;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, bytes);
  if (!p) {  // what the cache keeps may be what is missing: give it back and try once more
    free_cached();
    p = std::aligned_alloc(64, bytes);
  }
  if (!p) {
    struct rlimit limit {};
    const bool limited = ::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
    throw Error(fmt::format("out of host memory allocating {} bytes{}: lower the batch or the model's size{}", bytes,
                            limited ? fmt::format(" under the address-space limit (ulimit -v) of {:.2f} GiB",
                                                  static_cast<double>(limit.rlim_cur) / (1 << 30))
                                    : std::string(),
                            limited ? ", or raise the limit" : ""));
  }
  return p;
}

void release(void* ptr, size_t bytes) noexcept {
  if (!ptr) return;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (bytes <= c.limit) {
      // room for the newest block first: sizes the run has moved on from (another sequence
      // length, say) go, largest first, rather than this one
      c.trim_locked(c.limit - bytes);
      try {
        c.free_blocks[bytes].push_back(ptr);
        c.cached += bytes;
        return;
      } catch (...) {  // no memory for the bookkeeping: the block goes back instead
      }
    }
  }
  std::free(ptr);
}

size_t cached_bytes() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().cached;
}

size_t cache_limit() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return cache().limit;
}

void set_cache_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().limit = CAST_HOST_CACHE_KEEPS ? bytes : 0;
  cache().trim_locked(cache().limit);
}

void free_cached() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().trim_locked(0);
}

}  // namespace cast::host_cache
