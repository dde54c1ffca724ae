// What capture forbids (CUDA's rules, enforced by the host driver), concurrent replay of
// independent branches, graph debug dumps, and memory pools (MemPool).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "runtime/driver.h"
#include "test_util.h"

namespace accel::rt {
namespace {

class CaptureRulesTest : public testing::GraphFixture {};

// The host driver on its own refuses what CUDA refuses during a capture, by capture mode and
// by the calling thread's mode.
TEST(HostDriverCapture, RefusesUnsafeCallsAsCudaDoes) {
  auto driver = make_host_driver(HostDriverOptions{});
  DriverStream capturing = driver->stream_create(0, 0);
  DriverEvent ev = driver->event_create(0, false);
  using testing::capture_error_from_thread;

  driver->stream_begin_capture(capturing, CaptureMode::Global);
  EXPECT_RT_ERROR(driver->event_query(ev), CaptureError, "event_query is not allowed");
  EXPECT_RT_ERROR(driver->raw_alloc(0, 4096), CaptureError, "raw_alloc");
  EXPECT_RT_ERROR(driver->host_alloc(4096), CaptureError, "host_alloc");
  EXPECT_NE(capture_error_from_thread([&] {
              driver->event_synchronize(ev);
            }).find("begun by another thread"),
            std::string::npos);
  // A relaxed thread may (what the runtime does around an allocation for the capture).
  const CaptureMode previous = driver->thread_capture_mode_exchange(CaptureMode::Relaxed);
  EXPECT_EQ(previous, CaptureMode::Global);
  void* p = driver->raw_alloc(0, 4096);
  ASSERT_NE(p, nullptr);
  driver->raw_free(0, p, 4096);
  driver->thread_capture_mode_exchange(previous);
  // Another thread in thread-local mode ignores other threads' captures.
  EXPECT_EQ(capture_error_from_thread([&] {
              driver->thread_capture_mode_exchange(CaptureMode::ThreadLocal);
              driver->event_query(ev);
            }),
            "");
  driver->graph_destroy(driver->stream_end_capture(capturing));
  EXPECT_TRUE(driver->event_query(ev));  // allowed again

  // A thread-local capture forbids its own thread only; a relaxed one nobody.
  driver->stream_begin_capture(capturing, CaptureMode::ThreadLocal);
  EXPECT_RT_ERROR(driver->stream_query(capturing), CaptureError, "thread_local");
  EXPECT_EQ(capture_error_from_thread([&] { driver->event_query(ev); }), "");
  driver->graph_destroy(driver->stream_end_capture(capturing));
  driver->stream_begin_capture(capturing, CaptureMode::Relaxed);
  EXPECT_TRUE(driver->event_query(ev));
  driver->graph_destroy(driver->stream_end_capture(capturing));
  driver->event_destroy(ev);
  driver->stream_destroy(capturing);
}

// REVIEW.md point 2: pending record_stream frees, cache misses and graph resets during a
// capture make no event query and no free (the host driver would refuse them).
TEST_F(CaptureRulesTest, TheAllocatorMakesNoForbiddenCallDuringCapture) {
  Stream other = stream_create(0);
  void* used = rt::malloc(1 << 12, s_);
  record_stream(used, other);
  rt::free(used);  // pending: an event on `other`
  Graph old = graph_create();
  graph_capture_begin(old, s_);
  void* in_old = rt::malloc(1 << 12, s_);
  graph_capture_end(old);
  rt::free(in_old);

  host_empty_cache();
  const int64_t pinned_segments = host_memory_stats().segment.current;
  graph_capture_begin(g_, s_);
  void* small = rt::malloc(1 << 12, s_);              // processes no pending event
  void* big = rt::malloc(std::size_t{64} << 20, s_);  // a new segment, relaxed for the capture
  graph_destroy(old);  // its pool's memory stays until the capture ends
  empty_cache(0);      // frees nothing during a capture
  // Pinned memory during the capture (a graph's random state on cuda): the cache has none, and
  // the runtime relaxes the thread for the driver's allocation; freeing it caches it.
  void* pinned = host_malloc(16);
  ASSERT_NE(pinned, nullptr);
  host_free(pinned);
  host_empty_cache();  // frees nothing during a capture either
  EXPECT_EQ(host_memory_stats().segment.current, pinned_segments + 1);
  rt::free(small);
  rt::free(big);
  graph_capture_end(g_);
  EXPECT_EQ(stream_capture_status(s_), CaptureStatus::None);
  graph_reset(g_);
  empty_cache(0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, 0);
  host_empty_cache();
  EXPECT_EQ(host_memory_stats().segment.current, pinned_segments);
  stream_destroy(other);
}

// A copy into pageable host memory waits for its stream, which another stream's global capture
// forbids: the runtime refuses it before queueing the copy. Queued first, the copy would run
// after the refusal, into memory the caller had freed while unwinding (Tensor.item() on the
// default stream during a capture on another corrupted the heap).
TEST_F(CaptureRulesTest, ACopyThatMustWaitIsRefusedBeforeItIsQueued) {
  const Stream other = default_stream(0);
  float* dev = static_cast<float*>(rt::malloc(4 * sizeof(float), other));
  const float ones[4] = {1, 1, 1, 1};
  rt::memcpy(dev, ones, sizeof(ones), CopyKind::HostToDevice);
  float out[4] = {0, 0, 0, 0};
  graph_capture_begin(g_, s_, {}, CaptureMode::Global);
  EXPECT_RT_ERROR(memcpy_async(out, dev, sizeof(out), CopyKind::DeviceToHost, other), CaptureError,
                  "memcpy_async to pageable host memory");
  EXPECT_RT_ERROR(rt::memcpy(out, dev, sizeof(out), CopyKind::DeviceToHost), CaptureError,
                  "memcpy(");
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "invalidated by memcpy_async");
  stream_synchronize(other);
  for (float v : out) EXPECT_EQ(v, 0.0f);  // neither copy ran
  rt::free(dev);
}

TEST_F(CaptureRulesTest, AnotherThreadsCacheMissFollowsTheCaptureMode) {
  empty_cache(0);
  auto alloc_from_thread = [] {
    return testing::capture_error_from_thread([] {
      void* p = rt::malloc(std::size_t{32} << 20, default_stream(0));
      rt::free(p);
    });
  };
  graph_capture_begin(g_, s_, {}, CaptureMode::Global);
  const std::string error = alloc_from_thread();
  EXPECT_NE(error.find("allocating 33554432 bytes of new device memory"), std::string::npos)
      << error;
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "invalidated by allocating");
  for (CaptureMode mode : {CaptureMode::ThreadLocal, CaptureMode::Relaxed}) {
    empty_cache(0);
    graph_capture_begin(g_, s_, {}, mode);
    EXPECT_EQ(alloc_from_thread(), "");
    graph_capture_end(g_);
    graph_reset(g_);
  }
}

// Branches captured on two streams run at the same time on replay: each waits for the other
// to have started, which a serial replay could never satisfy (it would time out instead).
TEST_F(CaptureRulesTest, IndependentBranchesRunConcurrently) {
  Stream side = stream_create(0);
  std::mutex m;
  std::condition_variable cv;
  int started = 0;
  std::atomic<int> met{0};
  auto meet = [&] {
    std::unique_lock<std::mutex> lock(m);
    ++started;
    cv.notify_all();
    if (cv.wait_for(lock, std::chrono::seconds(5), [&] { return started % 2 == 0; })) ++met;
  };
  Event fork = event_create(0), join = event_create(0);
  graph_capture_begin(g_, s_);
  event_record(fork, s_);
  stream_wait_event(side, fork);
  launch_host_func(side, meet, "side");
  launch_host_func(s_, meet, "main");
  event_record(join, side);
  stream_wait_event(s_, join);
  graph_capture_end(g_);
  for (int i = 0; i < 3; ++i) {
    graph_replay(g_, s_);
    stream_synchronize(s_);
  }
  EXPECT_EQ(met.load(), 6);
  event_destroy(fork);
  event_destroy(join);
  stream_destroy(side);
}

TEST_F(CaptureRulesTest, AFailingBranchStopsItsDependentsAndIsReported) {
  SKIP_IF_LAUNCH_BLOCKING();  // the failure would surface at the replay call instead
  Stream side = stream_create(0);
  std::atomic<int> ran{0};
  Event fork = event_create(0), join = event_create(0);
  graph_capture_begin(g_, s_);
  event_record(fork, s_);
  stream_wait_event(side, fork);
  launch_host_func(side, [] { throw std::runtime_error("branch failed"); });
  launch_host_func(side, [&] { ran += 100; });  // depends on the failed node: never runs
  launch_host_func(s_, [&] { ran += 1; });
  event_record(join, side);
  stream_wait_event(s_, join);
  graph_capture_end(g_);
  graph_replay(g_, s_);
  EXPECT_RT_ERROR(stream_synchronize(s_), TaskError, "branch failed");
  // The host driver runs its graphs itself and skips what depends on a failed node; a GPU's
  // graph cannot know that a host function failed (the cuda driver reports it all the same).
  if (std::string(driver_name()) == "host") {
    EXPECT_LT(ran.load(), 100);
  }
  launch_host_func(s_, [&] { ran += 1000; });
  stream_synchronize(s_);  // the stream stays usable
  EXPECT_GE(ran.load(), 1000);
  event_destroy(fork);
  event_destroy(join);
  stream_destroy(side);
}

TEST_F(CaptureRulesTest, DebugDumpWritesTheNodesAndTheirDependencies) {
  Stream side = stream_create(0);
  Event fork = event_create(0), join = event_create(0);
  void* buf = rt::malloc(256, s_);
  graph_capture_begin(g_, s_);
  memset_async(buf, 0, 256, s_);
  event_record(fork, s_);
  stream_wait_event(side, fork);
  launch_host_func(
      side, [] {}, "side work");
  launch_host_func(
      s_, [] {}, "main \"work\"");
  event_record(join, side);
  stream_wait_event(s_, join);
  launch_host_func(
      s_, [] {}, "after join");
  graph_capture_end(g_);
  EXPECT_RT_ERROR(graph_debug_dump(g_, "/nonexistent/dir/g.dot"), InvalidValueError,
                  "cannot write");
  // One file per process: ctest runs this suite in several configurations at once.
  const std::string path =
      ::testing::TempDir() + "accel_graph_" + std::to_string(::getpid()) + ".dot";
  graph_debug_dump(g_, path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string dot = text.str();
  EXPECT_NE(dot.find("digraph"), std::string::npos);
  if (std::string(driver_name()) == "host") {  // other drivers: the vendor's format and labels
    EXPECT_NE(dot.find("n0 [label=\"0: memset\"]"), std::string::npos) << dot;
    EXPECT_NE(dot.find("1: side work"), std::string::npos) << dot;
    EXPECT_NE(dot.find("2: main \\\"work\\\""), std::string::npos) << dot;
    for (const char* edge : {"n0 -> n1;", "n0 -> n2;", "n1 -> n3;", "n2 -> n3;"}) {
      EXPECT_NE(dot.find(edge), std::string::npos) << edge << " in\n" << dot;
    }
  }
  std::remove(path.c_str());
  graph_reset(g_);
  EXPECT_RT_ERROR(graph_debug_dump(g_, path), InvalidValueError, "the graph is empty");
  rt::free(buf);
  event_destroy(fork);
  event_destroy(join);
  stream_destroy(side);
}

TEST(MemPool, ThreadAllocationsGoToThePoolUntilItIsReleased) {
  empty_cache(0);
  const PoolId pool = mem_pool_create(0);
  EXPECT_EQ(mem_pool_use_count(0, pool), 1);
  mem_pool_begin_allocate(0, pool);
  EXPECT_EQ(mem_pool_use_count(0, pool), 2);
  void* in_pool = rt::malloc(1 << 16);
  void* elsewhere = nullptr;
  std::thread([&] { elsewhere = rt::malloc(1 << 16); }).join();  // other threads: default pool
  mem_pool_end_allocate(0, pool);
  void* after = rt::malloc(1 << 16);
  EXPECT_EQ(mem_pool_use_count(0, pool), 1);
  EXPECT_RT_ERROR(mem_pool_end_allocate(0, pool), InvalidValueError, "is not allocating to pool");

  auto pool_of = [](void* p) {
    for (const SegmentInfo& s : memory_snapshot().segments) {
      const auto a = reinterpret_cast<uint64_t>(p);
      if (a >= s.addr && a < s.addr + s.total_size) return s.pool;
    }
    return PoolId{99, 99};
  };
  EXPECT_EQ(pool_of(in_pool), pool);
  EXPECT_TRUE(pool_of(elsewhere).is_default());
  EXPECT_TRUE(pool_of(after).is_default());
  rt::free(elsewhere);
  rt::free(after);
  empty_cache(0);
  const int64_t held = memory_stats(0).reserved_bytes[kAggregate].current;
  EXPECT_GT(held, 0);  // the pool's segment
  mem_pool_release(0, pool);
  EXPECT_EQ(mem_pool_use_count(0, pool), 0);
  rt::free(in_pool);  // the last tensor of a released pool: cached until empty_cache
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, held);
  empty_cache(0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, 0);
}

TEST(MemPool, NoSplitGivesEachAllocationItsOwnBlock) {
  const PoolId pool = mem_pool_create(0, MemPoolOptions{.no_split = true, .allocator = {}});
  mem_pool_begin_allocate(0, pool);
  void* a = rt::malloc(4096);
  void* b = rt::malloc(4096);
  mem_pool_end_allocate(0, pool);
  int segments = 0;
  for (const SegmentInfo& s : memory_snapshot().segments) {
    if (s.pool == pool) {
      ++segments;
      EXPECT_EQ(s.blocks.size(), 1u);  // never split
    }
  }
  EXPECT_EQ(segments, 2);
  rt::free(a);
  rt::free(b);
  mem_pool_release(0, pool);
}

}  // namespace
}  // namespace accel::rt
