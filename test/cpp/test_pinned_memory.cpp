// Pinned host memory: allocation, queries, statistics, the cache, and reuse after the streams
// recorded on a block passed it.
#include "test_util.h"

namespace accel::rt {
namespace {

using testing::Gate;

TEST(PinnedMemory, AllocateQueryFree) {
  // Blocks earlier tests freed while streams still used them (staging copies) stay reserved
  // until the streams passed them and the allocator looked: gone once every device is idle and
  // the cache emptied.
  for (int d = 0; d < device_count(); ++d) device_synchronize(d);
  host_empty_cache();
  host_reset_peak_stats();
  const HostStats before = host_memory_stats();
  char* p = static_cast<char*>(host_malloc(100));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(is_pinned(p));
  EXPECT_TRUE(is_pinned(p + 99));
  int local = 0;
  EXPECT_FALSE(is_pinned(&local));
  EXPECT_FALSE(is_pinned(nullptr));
  const HostStats during = host_memory_stats();
  EXPECT_EQ(during.allocation.current, before.allocation.current + 1);
  EXPECT_EQ(during.allocated_bytes.current, before.allocated_bytes.current + 4096);
  host_free(p);
  EXPECT_FALSE(is_pinned(p));
  EXPECT_RT_ERROR(host_free(p), InvalidPointerError, "already freed (double free)");
  EXPECT_RT_ERROR(host_free(&local), InvalidPointerError, "not the start of a pinned allocation");
  // Cached: the same block comes back.
  EXPECT_EQ(host_malloc(3000), p);
  host_free(p);
  host_empty_cache();
  EXPECT_EQ(host_memory_stats().reserved_bytes.current, 0);
  EXPECT_GT(host_memory_stats().allocation.allocated, 0);
  host_reset_accumulated_stats();
  EXPECT_EQ(host_memory_stats().allocation.allocated, 0);
  EXPECT_EQ(host_memory_stats().num_host_alloc, 0);
  EXPECT_EQ(host_malloc(0), nullptr);
}

TEST(PinnedMemory, ReuseWaitsForRecordedStreams) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  void* p = host_malloc(1 << 16);
  Gate gate;
  launch_host_func(s, [&] { gate.wait(); });
  host_record_stream(p, s);
  host_free(p);
  void* q = host_malloc(1 << 16);
  EXPECT_NE(q, p);  // p is still in use by s
  gate.open();
  stream_synchronize(s);
  void* r = host_malloc(1 << 16);
  EXPECT_EQ(r, p);
  host_free(q);
  host_free(r);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
