// The host tensors' cache (tensor/host_cache.h): a freed block serves the next tensor of its
// size, what tensors hold is counted apart from what the cache keeps, and the cache keeps no
// more than its limit.
#include "tensor/host_cache.h"
#include "tests/test_util.h"

using namespace cast;

namespace {

// Restores the limit and empties the cache whatever the test did.
struct CacheLimitGuard {
  size_t saved = host_cache::cache_limit();
  ~CacheLimitGuard() {
    host_cache::set_cache_limit(saved);
    host_cache::free_cached();
  }
};

}  // namespace

TEST(HostCache, AFreedBlockServesTheNextTensorOfItsSize) {
  if (host_cache::cache_limit() == 0) GTEST_SKIP() << "this build keeps nothing (AddressSanitizer)";
  CacheLimitGuard guard;
  host_cache::free_cached();
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000, 37});
    first = t.data<float>();
  }
  const size_t kept = host_cache::cached_bytes();
  EXPECT_GE(kept, size_t{1000 * 37 * 4});
  Tensor again = Tensor::empty({37, 1000});  // same bytes, another shape
  EXPECT_EQ(again.data<float>(), first);
  EXPECT_EQ(host_cache::cached_bytes(), kept - (1000 * 37 * 4 + 63) / 64 * 64);
  Tensor other = Tensor::empty({999, 37});  // another size: a new block
  EXPECT_NE(other.data<float>(), first);
}

TEST(HostCache, TensorsCountWhatTheyHoldNotWhatIsKept) {
  CacheLimitGuard guard;
  host_cache::free_cached();
  const size_t before = host_memory_stats().current;
  { Tensor t = Tensor::empty({1 << 20}); }
  EXPECT_EQ(host_memory_stats().current, before);  // the block went back, whether kept or freed
}

TEST(HostCache, KeepsNoMoreThanItsLimit) {
  CacheLimitGuard guard;
  host_cache::free_cached();
  host_cache::set_cache_limit(3 << 20);
  { Tensor a = Tensor::empty({1 << 20}), b = Tensor::empty({1 << 20}); }  // 8 MiB freed
  EXPECT_LE(host_cache::cached_bytes(), size_t{3} << 20);
  host_cache::set_cache_limit(0);
  EXPECT_EQ(host_cache::cached_bytes(), 0u);
  { Tensor c = Tensor::empty({1 << 10}); }
  EXPECT_EQ(host_cache::cached_bytes(), 0u);  // a limit of 0 keeps nothing
}

TEST(HostCache, ANewSizeMakesRoomByFreeingOldSizes) {
  // a run that moves to another sequence length keeps reusing memory: the full cache frees
  // its kept blocks of other sizes (largest first) to keep the block just given back
  if (host_cache::cache_limit() == 0) GTEST_SKIP() << "this build keeps nothing (AddressSanitizer)";
  CacheLimitGuard guard;
  host_cache::free_cached();
  host_cache::set_cache_limit(5 << 20);
  { Tensor old_length = Tensor::empty({1 << 20}); }  // 4 MiB kept
  EXPECT_EQ(host_cache::cached_bytes(), size_t{4} << 20);
  const void* second = nullptr;
  {
    Tensor new_length = Tensor::empty({1 << 19});  // 2 MiB
    second = new_length.data<float>();
  }
  EXPECT_EQ(host_cache::cached_bytes(), size_t{2} << 20);  // the 4 MiB block went
  Tensor again = Tensor::empty({1 << 19});
  EXPECT_EQ(again.data<float>(), second);
}

TEST(HostCache, ReusedMemoryIsStillPoisonedInTests) {
  // the tests' poison must reach a reused block too, or a kernel that skips part of its output
  // would read the last tensor's values instead of NaN
  CacheLimitGuard guard;
  const bool poison = poison_new_tensors();
  set_poison_new_tensors(true);
  { Tensor t = Tensor::full({4096}, 1.5); }
  Tensor u = Tensor::empty({4096});
  set_poison_new_tensors(poison);
  for (double v : u.to_double_vector()) ASSERT_TRUE(std::isnan(v));
}
