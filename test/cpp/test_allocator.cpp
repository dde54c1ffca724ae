// The caching allocator: size classes, splitting and merging, pools, per-stream reuse,
// record_stream, statistics, out-of-memory, history (pinned memory: test_pinned_memory.cpp).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::Gate;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

// Runs each test on device 1 with an empty cache and fresh peak/accumulated statistics.
class Allocator : public ::testing::Test {
 protected:
  void SetUp() override {
    device_synchronize(kDev);
    empty_cache(kDev);
    reset_peak_memory_stats(kDev);
    reset_accumulated_memory_stats(kDev);
    base_ = memory_stats(kDev);
    stream_ = stream_create(kDev);
  }
  void TearDown() override {
    stream_destroy(stream_);
    empty_cache(kDev);
  }
  int64_t cur(const StatArray& a, StatType t = kAggregate) { return a[t].current; }
  DeviceStats stats() { return memory_stats(kDev); }

  static constexpr int kDev = 1;
  DeviceStats base_;
  Stream stream_;
};

TEST_F(Allocator, ZeroSizeAndNull) {
  EXPECT_EQ(malloc(0, stream_), nullptr);
  free(nullptr);  // no-op
  EXPECT_EQ(stats().allocation[kAggregate].allocated, 0);
}

TEST_F(Allocator, RoundsToSizeClassesAndReportsRequestedBytes) {
  void* p = malloc(1, stream_);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  DeviceStats s = stats();
  EXPECT_EQ(cur(s.allocated_bytes), 512);
  EXPECT_EQ(cur(s.requested_bytes), 1);
  EXPECT_EQ(cur(s.reserved_bytes), int64_t(2 * MiB));  // one small segment
  EXPECT_EQ(cur(s.segment, kSmallPool), 1);
  EXPECT_EQ(cur(s.segment, kLargePool), 0);
  EXPECT_EQ(allocation_range(static_cast<char*>(p)).second, 1u);
  free(p);
  s = stats();
  EXPECT_EQ(cur(s.allocated_bytes), 0);
  EXPECT_EQ(cur(s.requested_bytes), 0);
  EXPECT_EQ(cur(s.reserved_bytes), int64_t(2 * MiB));  // cached, not returned
  empty_cache(kDev);
  EXPECT_EQ(cur(stats().reserved_bytes), 0);
}

TEST_F(Allocator, SplitsSegmentsAndMergesFreedNeighbours) {
  char* a = static_cast<char*>(malloc(1000, stream_));
  char* b = static_cast<char*>(malloc(1000, stream_));
  EXPECT_EQ(b, a + 1024);  // carved from the same segment
  DeviceStats s = stats();
  EXPECT_EQ(cur(s.segment), 1);
  EXPECT_EQ(cur(s.allocation), 2);
  EXPECT_EQ(cur(s.active), 2);
  EXPECT_EQ(cur(s.active_bytes), 2048);
  EXPECT_EQ(cur(s.inactive_split), 1);  // the rest of the segment
  EXPECT_EQ(cur(s.inactive_split_bytes), int64_t(2 * MiB - 2048));
  free(a);
  s = stats();
  EXPECT_EQ(cur(s.inactive_split), 2);  // a's hole and the tail
  EXPECT_EQ(cur(s.inactive_split_bytes), int64_t(2 * MiB - 1024));
  free(b);  // b merges with a and with the tail: the segment is whole again
  s = stats();
  EXPECT_EQ(cur(s.inactive_split), 0);
  EXPECT_EQ(cur(s.inactive_split_bytes), 0);
  EXPECT_EQ(cur(s.active), 0);
  // The whole 2 MiB is one block again: the largest small request takes it from the start.
  void* big = malloc(MiB, stream_);
  EXPECT_EQ(big, a);
  free(big);
  EXPECT_EQ(stats().num_device_alloc, 1);
}

TEST_F(Allocator, SmallAndLargePoolsAreSeparate) {
  void* small = malloc(MiB, stream_);          // largest small request
  void* huge = malloc(11 * MiB + 1, stream_);  // >= 10 MiB: a segment of the size rounded to 2 MiB
  void* large = malloc(MiB + 512, stream_);    // smallest large request: a new 20 MiB segment
  DeviceStats s = stats();
  EXPECT_EQ(cur(s.segment, kSmallPool), 1);
  EXPECT_EQ(cur(s.segment, kLargePool), 2);
  EXPECT_EQ(cur(s.reserved_bytes, kSmallPool), int64_t(2 * MiB));
  EXPECT_EQ(cur(s.reserved_bytes, kLargePool), int64_t(20 * MiB + 12 * MiB));
  EXPECT_EQ(cur(s.allocated_bytes, kLargePool), int64_t(MiB + 512 + 12 * MiB));
  EXPECT_EQ(cur(s.allocation, kAggregate), 3);
  free(small);
  free(large);
  free(huge);
  s = stats();
  EXPECT_EQ(s.allocation[kAggregate].allocated, 3);
  EXPECT_EQ(s.allocation[kAggregate].freed, 3);
  EXPECT_EQ(s.allocation[kAggregate].peak, 3);
  empty_cache(kDev);
  s = stats();
  EXPECT_EQ(cur(s.reserved_bytes), 0);
  EXPECT_EQ(cur(s.segment), 0);
  EXPECT_EQ(s.num_device_free, 3);
  EXPECT_EQ(s.segment[kAggregate].freed, 3);
}

TEST_F(Allocator, PeakAndAccumulatedStatsReset) {
  void* a = malloc(4 * MiB, stream_);
  void* b = malloc(4 * MiB, stream_);
  free(a);
  free(b);
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes[kAggregate].peak, int64_t(8 * MiB));
  EXPECT_EQ(s.allocated_bytes[kAggregate].allocated, int64_t(8 * MiB));
  EXPECT_EQ(s.allocated_bytes[kAggregate].freed, int64_t(8 * MiB));
  reset_peak_memory_stats(kDev);
  EXPECT_EQ(stats().allocated_bytes[kAggregate].peak, 0);
  reset_accumulated_memory_stats(kDev);
  s = stats();
  EXPECT_EQ(s.allocated_bytes[kAggregate].allocated, 0);
  EXPECT_EQ(s.allocated_bytes[kAggregate].freed, 0);
  EXPECT_EQ(s.num_device_alloc, 0);
  EXPECT_EQ(cur(s.reserved_bytes), int64_t(20 * MiB));  // current values untouched
}

TEST_F(Allocator, FreedBlockIsReusedByItsOwnStreamOnly) {
  void* p = malloc(4096, stream_);
  free(p);
  EXPECT_EQ(malloc(4096, stream_), p);  // stream order makes immediate reuse safe
  free(p);
  Stream other = stream_create(kDev);
  void* q = malloc(4096, other);
  EXPECT_NE(q, p);
  free(q);
  stream_destroy(other);
}

TEST_F(Allocator, WithCachingOffEachAllocationHasItsOwnMemoryGivenBackWhenFreed) {
  void* cached = malloc(4096, stream_);  // before: returns to the cache whatever happens next
  set_memory_caching(false, kDev);
  EXPECT_FALSE(memory_caching(kDev));
  EXPECT_TRUE(memory_caching(0)) << "the setting is per device";
  void* a = malloc(1000, stream_);
  void* b = malloc(1000, stream_);
  DeviceStats s = stats();
  // Segments of their own, of the rounded size (not 2 MiB small segments shared by both).
  EXPECT_EQ(cur(s.segment), 3);
  EXPECT_EQ(cur(s.reserved_bytes), int64_t(2 * MiB + 2 * 1024));
  const uint64_t free_before = mem_get_info(kDev).free;
  // Work on the stream still uses `a` when it is freed: the driver takes it back only after.
  memset_async(a, 0, 1000, stream_);
  if (driver_capabilities().host_accessible_memory) {  // a task may read device memory
    Gate gate;
    std::atomic<float> seen{1.f};
    float* fa = static_cast<float*>(a);
    if (launch_blocking()) gate.open();  // the task below runs at once, on this thread
    launch_host_func(stream_, [&gate, &seen, fa] {
      gate.wait();
      seen = fa[0];
    });
    free(a);
    gate.open();
    stream_synchronize(stream_);
    EXPECT_EQ(seen.load(), 0.f);
  } else {  // a GPU's free waits for the device (cudaFree synchronizes): no gate to open after
    launch_host_func(stream_, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
    free(a);
    EXPECT_TRUE(stream_query(stream_)) << "the driver took the memory back before the work ended";
  }
  s = stats();
  EXPECT_EQ(cur(s.segment), 2);
  EXPECT_EQ(cur(s.reserved_bytes), int64_t(2 * MiB + 1024));
  EXPECT_EQ(s.num_device_free - base_.num_device_free, 1);
  EXPECT_GT(mem_get_info(kDev).free, free_before) << "the driver has the memory back";
  free(cached);  // allocated with caching on: cached
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(2 * MiB + 1024));
  set_memory_caching(true, kDev);
  free(b);  // allocated with caching off: given back all the same
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(2 * MiB));
  void* c = malloc(1000, stream_);  // caching again: from the cached small segment
  EXPECT_EQ(cur(stats().segment), 1);
  free(c);
  EXPECT_RT_ERROR(set_memory_caching(false, 7), InvalidDeviceError, "set_memory_caching");
}

// PyTorch's allocator settings (PYTORCH_ALLOC_CONF through the PyTorch integration).
class AllocatorSettingsTest : public Allocator {
 protected:
  void TearDown() override {
    set_allocator_settings(AllocatorSettings{});
    set_memory_fraction(1.0, kDev);
    Allocator::TearDown();
  }
};

TEST_F(AllocatorSettingsTest, RoundupPowerOfTwoDivisions) {
  AllocatorSettings s;
  s.roundup_power2_divisions.assign(16, 4);
  set_allocator_settings(s);
  EXPECT_EQ(allocator_settings().roundup_power2_divisions.size(), 16u);
  // 1.2 MiB: between 1 and 2 MiB in quarters, so 1.25 MiB.
  void* a = malloc(MiB + MiB / 5, stream_);
  EXPECT_EQ(cur(stats().allocated_bytes), int64_t(MiB + MiB / 4));
  // Powers of two and sizes up to 4 x 512 bytes keep the 512-byte rounding.
  void* b = malloc(1500, stream_);
  void* c = malloc(4 * MiB, stream_);
  EXPECT_EQ(cur(stats().allocated_bytes), int64_t(MiB + MiB / 4 + 1536 + 4 * MiB));
  for (void* p : {a, b, c}) free(p);
}

TEST_F(AllocatorSettingsTest, OversizeBlocksAreNotSplitAndServeOnlyLargeRequests) {
  AllocatorSettings s;
  s.max_split_size = 64 * MiB;
  set_allocator_settings(s);
  EXPECT_EQ(stats().max_split_size, int64_t(64 * MiB));
  void* big = malloc(100 * MiB, stream_);
  EXPECT_EQ(stats().oversize_allocations.current, 1);
  EXPECT_EQ(stats().oversize_segments.current, 1);
  free(big);
  EXPECT_EQ(stats().oversize_allocations.current, 0);
  // A smaller request does not carve the cached 100 MiB block: a segment of its own.
  void* small = malloc(30 * MiB, stream_);
  EXPECT_EQ(cur(stats().segment), 2);
  // A large request less than 20 MiB short of it takes it whole, unsplit ...
  void* again = malloc(85 * MiB, stream_);
  EXPECT_EQ(again, big);
  EXPECT_EQ(cur(stats().segment), 2);
  EXPECT_EQ(cur(stats().allocated_bytes), int64_t(30 * MiB + 100 * MiB));
  EXPECT_EQ(cur(stats().inactive_split), 0);
  free(again);
  // ... but not one it exceeds by 20 MiB or more.
  void* other = malloc(80 * MiB, stream_);
  EXPECT_NE(other, big);
  EXPECT_EQ(stats().oversize_segments.current, 2);
  free(other);
  free(small);
  // Without the limit a cached large block serves a smaller request again, split.
  set_allocator_settings(AllocatorSettings{});
  EXPECT_EQ(stats().max_split_size, -1);
  EXPECT_EQ(stats().oversize_segments.current, 0);
  void* carved = malloc(40 * MiB, stream_);
  EXPECT_EQ(cur(stats().segment), 3);
  EXPECT_EQ(cur(stats().inactive_split), 1);
  free(carved);
}

TEST_F(AllocatorSettingsTest, GarbageCollectionFreesTheLongestUnusedSegmentsOverTheThreshold) {
  set_memory_fraction(0.1, kDev);  // 409.6 MiB of the 4 GiB device may be reserved
  AllocatorSettings s;
  s.garbage_collection_threshold = 0.5;  // collect beyond 204.8 MiB
  set_allocator_settings(s);
  void* a = malloc(60 * MiB, stream_);
  void* b = malloc(62 * MiB, stream_);
  void* c = malloc(64 * MiB, stream_);
  free(a);
  free(c);
  free(b);  // freed last: used most recently
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(186 * MiB));
  const int64_t frees = stats().num_device_free;
  // 100 MiB more would make 286 MiB: a (oldest) and c go, b stays.
  void* d = malloc(100 * MiB, stream_);
  EXPECT_EQ(stats().num_device_free - frees, 2);
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(162 * MiB));
  const int64_t allocs = stats().num_device_alloc;
  void* b2 = malloc(62 * MiB, stream_);
  EXPECT_EQ(b2, b);
  EXPECT_EQ(stats().num_device_alloc, allocs);
  free(b2);
  free(d);
}

TEST_F(AllocatorSettingsTest, ExpandableSegmentsGrowOneRangeOfAddressesPerStream) {
  if (!driver_capabilities().virtual_memory) GTEST_SKIP() << "the driver has no virtual memory";
  AllocatorSettings s;
  s.expandable_segments = true;
  set_allocator_settings(s);
  // Blocks of any size follow each other in one segment, mapped in 2 MiB units.
  char* a = static_cast<char*>(malloc(3 * MiB, stream_));
  char* b = static_cast<char*>(malloc(5 * MiB, stream_));
  char* c = static_cast<char*>(malloc(4 * MiB, stream_));
  EXPECT_EQ(b, a + 3 * MiB);
  EXPECT_EQ(c, b + 5 * MiB);
  EXPECT_EQ(cur(stats().segment), 1);
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(12 * MiB));
  // The memory holds what is written to it.
  const std::vector<float> values = {1.f, 2.f, 3.f, 4.f};
  memcpy(b + 5 * MiB - sizeof(float) * 4, values.data(), sizeof(float) * 4, CopyKind::HostToDevice);
  std::vector<float> back(4);
  memcpy(back.data(), b + 5 * MiB - sizeof(float) * 4, sizeof(float) * 4, CopyKind::DeviceToHost);
  EXPECT_EQ(back, values);
  // Freed neighbours merge whatever their sizes: 8 MiB fit where a and b were, mapping nothing.
  free(a);
  free(b);
  const int64_t maps = stats().num_device_alloc;
  char* d = static_cast<char*>(malloc(8 * MiB, stream_));
  EXPECT_EQ(d, a);
  EXPECT_EQ(stats().num_device_alloc, maps);
  // A request larger than any free block grows the end: the free tail (none here) plus pages.
  free(c);
  char* e = static_cast<char*>(malloc(6 * MiB, stream_));
  EXPECT_EQ(e, a + 8 * MiB) << "the free 4 MiB at the end were extended by 2 MiB";
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(14 * MiB));
  // Another stream grows its own range.
  Stream other = stream_create(kDev);
  void* f = malloc(MiB + MiB / 2, other);
  EXPECT_EQ(cur(stats().segment), 2);
  free(f);
  stream_destroy(other);
  // Emptying the cache unmaps the free ends: with nothing allocated, every range goes.
  free(e);
  empty_cache(kDev);
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(8 * MiB)) << "d keeps its pages";
  free(d);
  empty_cache(kDev);
  EXPECT_EQ(cur(stats().reserved_bytes), 0);
  EXPECT_EQ(cur(stats().segment), 0);
  EXPECT_EQ(mem_get_info(kDev).free, mem_get_info(kDev).total);
  // Small requests too, in the small pool's own range; out of memory is still typed.
  void* g = malloc(1000, stream_);
  EXPECT_EQ(cur(stats().reserved_bytes), int64_t(2 * MiB));
  EXPECT_RT_ERROR(malloc(5 * GiB, stream_), OutOfMemoryError, "Tried to allocate 5.00 GiB");
  free(g);
}

TEST_F(AllocatorSettingsTest, BadSettingsAreRefusedByName) {
  AllocatorSettings s;
  s.garbage_collection_threshold = 1.0;
  EXPECT_RT_ERROR(set_allocator_settings(s), InvalidValueError, "garbage_collection_threshold");
  s = {};
  s.max_split_size = MiB;
  EXPECT_RT_ERROR(set_allocator_settings(s), InvalidValueError, "max_split_size must be more");
  s = {};
  s.roundup_power2_divisions = {3};
  EXPECT_RT_ERROR(set_allocator_settings(s), InvalidValueError, "powers of two, got 3");
  EXPECT_EQ(allocator_settings().garbage_collection_threshold, 0.0);
}

TEST_F(Allocator, RecordStreamDelaysReuseUntilTheOtherStreamPasses) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream user = stream_create(kDev);
  void* p = malloc(4096, stream_);
  Gate gate;
  launch_host_func(user, [&] { gate.wait(); });  // `user` still works with p
  record_stream(p, user);
  free(p);
  DeviceStats s = stats();
  EXPECT_EQ(cur(s.allocation), 0);  // freed by the caller...
  EXPECT_EQ(cur(s.active), 1);      // ...but still active until `user` passes the free
  void* q = malloc(4096, stream_);
  EXPECT_NE(q, p);
  free(q);
  gate.open();
  stream_synchronize(user);
  void* r = malloc(4096, stream_);  // the pending event completed: p is back in the cache
  EXPECT_EQ(r, p);
  free(r);
  EXPECT_EQ(cur(stats().active), 0);
  stream_destroy(user);
}

TEST_F(Allocator, RecordStreamOnADestroyedStreamNeedsNoWait) {
  Stream user = stream_create(kDev);
  void* p = malloc(4096, stream_);
  record_stream(p, user);
  record_stream(p, stream_);  // its own stream: nothing to do
  stream_destroy(user);
  free(p);
  EXPECT_EQ(malloc(4096, stream_), p);
  free(p);
}

TEST_F(Allocator, MemoryPressureHooksGiveBackMemoryHeldElsewhereBeforeOutOfMemory) {
  // Another library's cache on the device (here a block the hook owns) is given back when an
  // allocation would otherwise fail; the allocation then succeeds and no OOM is counted.
  static std::atomic<void*> held{nullptr};
  static std::atomic<int> calls{0};
  static std::once_flag attached;  // hooks stay attached: later OOM tests find it empty
  std::call_once(attached, [] {
    attach_memory_pressure_hook([](int device, std::size_t requested) {
      void* p = held.exchange(nullptr);
      if (p == nullptr) return false;
      ++calls;
      EXPECT_EQ(device, kDev);
      EXPECT_EQ(requested, 2 * GiB);
      free(p);
      return true;
    });
  });
  held = malloc(3 * GiB, stream_);
  const int64_t ooms = stats().num_ooms;
  void* b = malloc(2 * GiB, stream_);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(held.load(), nullptr);
  EXPECT_EQ(stats().num_ooms, ooms);
  // Nothing more to give back: past the capacity it is an OutOfMemoryError as before.
  EXPECT_RT_ERROR(malloc(3 * GiB, stream_), OutOfMemoryError, "Tried to allocate 3.00 GiB");
  EXPECT_EQ(calls.load(), 1);
  free(b);
  EXPECT_RT_ERROR(attach_memory_pressure_hook({}), InvalidValueError, "the hook is empty");
}

TEST_F(Allocator, OutOfMemoryIsATypedErrorWithTheNumbers) {
  void* a = malloc(3 * GiB, stream_);
  ASSERT_NE(a, nullptr);
  try {
    malloc(2 * GiB, stream_);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::OutOfMemory);
    EXPECT_NE(m.find("accel out of memory. Tried to allocate 2.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("was needed) on device 1."), std::string::npos) << m;
    EXPECT_NE(m.find("total capacity of 4.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("3.00 GiB allocated"), std::string::npos) << m;
    if (driver_capabilities().host_accessible_memory) {  // the host driver (or testdrv)
      EXPECT_NE(m.find("ACCEL_HOST_MEMORY"), std::string::npos) << m;
    }
  }
  DeviceStats s = stats();
  EXPECT_EQ(s.num_ooms, 1);
  EXPECT_GE(s.num_alloc_retries, 1);
  // The device is still usable.
  void* small = malloc(1024, stream_);
  EXPECT_NE(small, nullptr);
  free(small);
  free(a);
  // 3 GiB are cached for stream_. Another stream cannot use them, so its 2 GiB request first
  // fails, frees the cache, and succeeds on the retry.
  Stream other = stream_create(kDev);
  const int64_t retries = stats().num_alloc_retries;
  void* b = malloc(2 * GiB, other);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(stats().num_alloc_retries, retries + 1);
  EXPECT_EQ(stats().num_ooms, 1);
  free(b);
  stream_destroy(other);
}

TEST_F(Allocator, LargerThanTheDeviceFailsAtOnce) {
  EXPECT_RT_ERROR(malloc(5 * GiB, stream_), OutOfMemoryError, "Tried to allocate 5.00 GiB");
}

TEST_F(Allocator, NegativeAndAbsurdSizesAreRejected) {
  EXPECT_RT_ERROR(malloc(static_cast<std::size_t>(-1024), stream_), InvalidValueError,
                  "not a valid size");
  EXPECT_RT_ERROR(malloc(SIZE_MAX, stream_), InvalidValueError, "negative size");
  // Valid sizes larger than any device run out of memory, as CUDA's do.
  const int64_t ooms = memory_stats(kDev).num_ooms;
  EXPECT_RT_ERROR(malloc(std::size_t{1} << 62, stream_), OutOfMemoryError,
                  "Tried to allocate 4.00 EiB");
  EXPECT_EQ(memory_stats(kDev).num_ooms, ooms + 1);
  EXPECT_RT_ERROR(host_malloc(static_cast<std::size_t>(-1)), InvalidValueError, "not a valid size");
}

TEST_F(Allocator, BadPointersAreTypedErrors) {
  char* p = static_cast<char*>(malloc(4096, stream_));
  int local = 0;
  EXPECT_RT_ERROR(free(&local), InvalidPointerError, "was not returned by accel::rt::malloc");
  EXPECT_RT_ERROR(free(p + 512), InvalidPointerError, "middle of an allocation");
  free(p);
  EXPECT_RT_ERROR(free(p), InvalidPointerError, "already freed (double free)");
  EXPECT_RT_ERROR(record_stream(p, stream_), InvalidPointerError, "record_stream");
  // The allocator is intact after the errors.
  void* q = malloc(4096, stream_);
  EXPECT_EQ(q, p);
  free(q);
}

TEST_F(Allocator, PointerQueries) {
  char* p = static_cast<char*>(malloc(10000, stream_));
  EXPECT_EQ(pointer_device(p), kDev);
  EXPECT_EQ(pointer_device(p + 9999), kDev);
  int local = 0;
  EXPECT_EQ(pointer_device(&local), -1);
  EXPECT_EQ(pointer_device(nullptr), -1);
  auto [start, size] = allocation_range(p + 100);
  EXPECT_EQ(start, p);
  EXPECT_EQ(size, 10000u);
  EXPECT_EQ(allocation_range(&local).first, nullptr);
  free(p);
  EXPECT_EQ(allocation_range(p).first, nullptr);  // freed
}

class Recorded : public HistoryContext {
 public:
  explicit Recorded(int n) : n_(n) {}
  std::string to_string() const override { return "ctx-" + std::to_string(n_); }

 private:
  int n_;
};

TEST_F(Allocator, MemoryHistoryRecordsEventsWithContext) {
  std::atomic<int> counter{0};
  record_memory_history(
      true, [&] { return std::make_shared<Recorded>(counter++); }, 100);
  void* p = malloc(3000, stream_);
  free(p);
  MemorySnapshot snap = memory_snapshot();
  record_memory_history(false);
  ASSERT_EQ(snap.device_traces.size(), 2u);
  const auto& trace = snap.device_traces[kDev];
  ASSERT_GE(trace.size(), 4u);
  // segment_alloc, alloc, free_requested, free_completed
  EXPECT_EQ(trace[0].action, TraceEntry::Action::SegmentAlloc);
  EXPECT_EQ(trace[1].action, TraceEntry::Action::Alloc);
  EXPECT_EQ(trace[1].addr, reinterpret_cast<uint64_t>(p));
  EXPECT_EQ(trace[1].size, 3072u);
  EXPECT_EQ(trace[1].stream, stream_.bits());
  ASSERT_NE(trace[1].context, nullptr);
  EXPECT_EQ(trace[1].context->to_string(), "ctx-0");
  EXPECT_EQ(trace[2].action, TraceEntry::Action::FreeRequested);
  EXPECT_EQ(trace[3].action, TraceEntry::Action::FreeCompleted);
  EXPECT_STREQ(trace_action_name(trace[3].action), "free_completed");
  bool found = false;
  for (const SegmentInfo& seg : snap.segments) {
    if (seg.device != kDev) continue;
    found = true;
    EXPECT_EQ(seg.total_size, 2 * MiB);
    EXPECT_FALSE(seg.is_large);
    EXPECT_EQ(seg.allocated_size, 0u);
    ASSERT_EQ(seg.blocks.size(), 1u);
    EXPECT_EQ(seg.blocks[0].state, BlockInfo::State::Inactive);
  }
  EXPECT_TRUE(found);
  EXPECT_TRUE(memory_snapshot().device_traces[kDev].empty());  // disabled: cleared
}

TEST_F(Allocator, HistoryKeepsTheNewestEntries) {
  record_memory_history(true, {}, 3);
  for (int i = 0; i < 10; ++i) free(malloc(512 * (i + 1), stream_));
  MemorySnapshot snap = memory_snapshot();
  record_memory_history(false);
  ASSERT_EQ(snap.device_traces[kDev].size(), 3u);
  EXPECT_EQ(snap.device_traces[kDev].back().action, TraceEntry::Action::FreeCompleted);
  EXPECT_EQ(snap.device_traces[kDev].back().context, nullptr);
}

TEST_F(Allocator, SnapshotShowsAllocatedAndSplitBlocks) {
  void* a = malloc(1024, stream_);
  void* b = malloc(2048, stream_);
  MemorySnapshot snap = memory_snapshot();
  const SegmentInfo* seg = nullptr;
  for (const auto& s : snap.segments) {
    if (s.device == kDev && s.addr == reinterpret_cast<uint64_t>(a)) seg = &s;
  }
  ASSERT_NE(seg, nullptr);
  ASSERT_EQ(seg->blocks.size(), 3u);
  EXPECT_EQ(seg->blocks[0].state, BlockInfo::State::ActiveAllocated);
  EXPECT_EQ(seg->blocks[1].addr, reinterpret_cast<uint64_t>(b));
  EXPECT_EQ(seg->blocks[1].requested_size, 2048u);
  EXPECT_EQ(seg->blocks[2].state, BlockInfo::State::Inactive);
  EXPECT_EQ(seg->allocated_size, 3072u);
  EXPECT_EQ(seg->stream, stream_.bits());
  free(a);
  free(b);
}

}  // namespace
}  // namespace accel::rt
