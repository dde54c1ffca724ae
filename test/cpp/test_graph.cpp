// Graph capture and replay, private memory pools, multi-stream capture, capture rules.
#include <atomic>
#include <mutex>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::DeviceBuffer;
using testing::download;
using testing::Gate;

class GraphTest : public testing::GraphFixture {};

TEST_F(GraphTest, CapturedWorkRunsOnlyOnReplay) {
  std::vector<int> log;
  graph_capture_begin(g_, s_);
  EXPECT_EQ(stream_capture_status(s_), CaptureStatus::Active);
  EXPECT_TRUE(device_is_capturing(0));
  EXPECT_FALSE(device_is_capturing(1));
  for (int i = 0; i < 3; ++i) launch_host_func(s_, [&log, i] { log.push_back(i); });
  graph_capture_end(g_);
  EXPECT_EQ(stream_capture_status(s_), CaptureStatus::None);
  EXPECT_FALSE(device_is_capturing(0));
  device_synchronize(0);
  EXPECT_TRUE(log.empty());  // recorded, not run
  EXPECT_EQ(graph_node_count(g_), 3u);
  graph_instantiate(g_);
  for (int r = 0; r < 4; ++r) graph_replay(g_, s_);
  stream_synchronize(s_);
  ASSERT_EQ(log.size(), 12u);
  for (std::size_t i = 0; i < log.size(); ++i) EXPECT_EQ(log[i], int(i % 3));
  // Replay on another stream of the device, and on the current stream.
  Stream other = stream_create(0);
  graph_replay(g_, other);
  stream_synchronize(other);
  graph_replay(g_);
  stream_synchronize(current_stream(0));
  EXPECT_EQ(log.size(), 18u);
  stream_destroy(other);
}

TEST_F(GraphTest, ReplayIsOrderedWithEagerWork) {
  std::vector<int> log;
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [&] { log.push_back(1); });
  graph_capture_end(g_);
  launch_host_func(s_, [&] { log.push_back(0); });
  graph_replay(g_, s_);
  launch_host_func(s_, [&] { log.push_back(2); });
  stream_synchronize(s_);
  EXPECT_EQ(log, (std::vector<int>{0, 1, 2}));
}

TEST_F(GraphTest, ResetDropsTheWorkAndAllowsANewCapture) {
  int runs = 0;
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [&] { ++runs; });
  graph_capture_end(g_);
  EXPECT_RT_ERROR(graph_capture_begin(g_, s_), CaptureError, "call graph_reset");
  graph_reset(g_);
  EXPECT_RT_ERROR(graph_replay(g_, s_), InvalidValueError, "the graph is empty");
  EXPECT_EQ(graph_node_count(g_), 0u);
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [&] { runs += 10; });
  graph_capture_end(g_);
  graph_replay(g_, s_);
  stream_synchronize(s_);
  EXPECT_EQ(runs, 10);
}

TEST_F(GraphTest, MisuseIsReported) {
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "no capture into this graph is underway");
  EXPECT_RT_ERROR(graph_replay(g_, s_), InvalidValueError, "the graph is empty");
  EXPECT_RT_ERROR(graph_capture_begin(g_, default_stream(0)), CaptureError, "cannot be captured");
  graph_capture_begin(g_, s_);
  EXPECT_RT_ERROR(graph_capture_begin(g_, s_), CaptureError, "already underway");
  Graph g2 = graph_create();
  EXPECT_RT_ERROR(graph_capture_begin(g2, s_), CaptureError, "is already capturing");
  EXPECT_RT_ERROR(graph_replay(g_, s_), CaptureError, "still underway");
  EXPECT_RT_ERROR(stream_destroy(s_), CaptureError, "is capturing a graph");
  launch_host_func(s_, [] {});
  graph_capture_end(g_);
  EXPECT_RT_ERROR(graph_replay(g_, stream_create(1)), InvalidValueError, "captured on device 0");
  graph_destroy(g2);
  EXPECT_RT_ERROR(graph_replay(g2, s_), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(graph_reset(g2), InvalidHandleError, "graph");
}

TEST_F(GraphTest, AllocationsDuringCaptureComeFromAPrivatePool) {
  void* eager_before = malloc(4096, s_);
  free(eager_before);
  float* captured = nullptr;
  graph_capture_begin(g_, s_);
  captured = static_cast<float*>(malloc(4096, s_));
  EXPECT_NE(static_cast<void*>(captured), eager_before);  // not the eager cache
  testing::device_kernel(s_, captured, 1024, [](float* v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) v[i] += 1.f;
  });
  graph_capture_end(g_);
  EXPECT_NE(graph_pool(g_), PoolId{});
  // The block stays reserved for the graph: eager allocations never get it.
  void* eager_after = malloc(4096, s_);
  EXPECT_NE(eager_after, static_cast<void*>(captured));
  free(eager_after);
  memset(captured, 0, 4096);
  for (int r = 0; r < 5; ++r) graph_replay(g_, s_);
  stream_synchronize(s_);
  EXPECT_EQ(download(captured, 1024), std::vector<float>(1024, 5.f));
  free(captured);
}

TEST_F(GraphTest, PrivatePoolMemoryIsReleasedWithTheGraph) {
  empty_cache(0);
  const int64_t reserved0 = memory_stats(0).reserved_bytes[kAggregate].current;
  graph_capture_begin(g_, s_);
  void* p = malloc(8 << 20, s_);  // a large-pool segment of its own
  launch_host_func(s_, [] {});
  free(p);  // freed during capture: back to the private pool, not to the eager cache
  graph_capture_end(g_);
  empty_cache(0);  // the graph still holds its pool
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved0 + (20 << 20));
  graph_reset(g_);  // no holder left: as CUDA's, the segment stays cached until empty_cache
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved0 + (20 << 20));
  empty_cache(0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved0);
}

// A tensor allocated before the capture, used by it, then freed: CUDA leaves a replay writing
// memory an empty_cache gave back (an illegal address); here the graph keeps its segment.
TEST_F(GraphTest, AGraphKeepsTheSegmentsItsWorkUsesUntilItGoes) {
  empty_cache(0);
  const int64_t reserved0 = memory_stats(0).reserved_bytes[kAggregate].current;
  const std::size_t n = (12 << 20) / sizeof(float);
  auto* x = static_cast<float*>(malloc(n * sizeof(float), s_));  // a segment of its own
  auto* y = static_cast<float*>(malloc(n * sizeof(float), s_));  // and another
  const int64_t reserved1 = memory_stats(0).reserved_bytes[kAggregate].current;
  EXPECT_EQ(reserved1, reserved0 + (24 << 20));
  memset(x, 0, n * sizeof(float));
  capture_keep_memory(s_, x);  // not capturing: nothing kept
  int on_stack = 0;
  graph_capture_begin(g_, s_);
  testing::device_kernel(s_, x, n, [](float* v, std::size_t m) {
    for (std::size_t i = 0; i < m; ++i) v[i] += 1.f;
  });
  capture_keep_memory(s_, x + 5);      // the segment holding x, found from any address in it
  capture_keep_memory(s_, x);          // once per capture
  capture_keep_memory(s_, &on_stack);  // not the allocator's: ignored
  memset_async(y, 0, 64, s_);          // the runtime's own captured calls keep their memory
  graph_capture_end(g_);
  free(x);
  free(y);
  empty_cache(0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved1);
  graph_replay(g_, s_);  // into cached memory, which is still mapped
  stream_synchronize(s_);
  graph_reset(g_);  // kept no longer, cached until empty_cache
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved1);
  empty_cache(0);
  EXPECT_EQ(memory_stats(0).reserved_bytes[kAggregate].current, reserved0);
  Stream gone = stream_create(0);
  stream_destroy(gone);
  EXPECT_RT_ERROR(capture_keep_memory(gone, x), InvalidHandleError, "capture_keep_memory");
}

TEST_F(GraphTest, AGraphKeepsThePinnedMemoryOfItsCopies) {
  host_empty_cache();
  const int64_t reserved0 = host_memory_stats().reserved_bytes.current;
  auto* h = static_cast<float*>(host_malloc(1 << 20));
  for (int i = 0; i < 256; ++i) h[i] = static_cast<float>(i);
  auto* d = static_cast<float*>(malloc(1024, s_));
  graph_capture_begin(g_, s_);
  memcpy_async(d, h, 1024, CopyKind::HostToDevice, s_);
  graph_capture_end(g_);
  host_free(h);
  host_empty_cache();  // the graph's copy still reads the block
  EXPECT_EQ(host_memory_stats().reserved_bytes.current, reserved0 + (1 << 20));
  graph_replay(g_, s_);
  stream_synchronize(s_);
  EXPECT_EQ(download(d, 256)[255], 255.f);  // the freed block was not reused in between
  graph_reset(g_);
  host_empty_cache();
  EXPECT_EQ(host_memory_stats().reserved_bytes.current, reserved0);
  free(d);
}

TEST_F(GraphTest, GraphsCanShareAPool) {
  const PoolId shared = graph_pool_handle();
  EXPECT_EQ(shared.first, 0u);
  EXPECT_NE(shared.second, 0u);
  graph_capture_begin(g_, s_, shared);
  void* a = malloc(4096, s_);
  launch_host_func(s_, [] {});
  free(a);
  graph_capture_end(g_);
  EXPECT_EQ(graph_pool(g_), shared);
  Graph g2 = graph_create();
  graph_capture_begin(g2, s_, shared);
  void* b = malloc(4096, s_);
  EXPECT_EQ(b, a);  // reused within the shared pool
  free(b);
  graph_capture_end(g2);
  // A graph with its own pool does not see those blocks.
  Graph g3 = graph_create();
  graph_capture_begin(g3, s_);
  void* c = malloc(4096, s_);
  EXPECT_NE(c, a);
  free(c);
  graph_capture_end(g3);
  graph_destroy(g2);
  graph_destroy(g3);
}

TEST_F(GraphTest, CaptureAcrossStreamsWithEvents) {
  Stream side = stream_create(0);
  Event fork = event_create(0), join = event_create(0);
  std::mutex m;
  std::vector<std::string> log;
  auto note = [&](const char* what) {
    return [&log, &m, what] {
      std::lock_guard<std::mutex> lock(m);
      log.emplace_back(what);
    };
  };
  graph_capture_begin(g_, s_);
  launch_host_func(s_, note("first"));
  event_record(fork, s_);
  stream_wait_event(side, fork);  // side joins the capture
  EXPECT_EQ(stream_capture_status(side), CaptureStatus::Active);
  launch_host_func(side, note("side"));
  launch_host_func(s_, note("main"));
  event_record(join, side);
  stream_wait_event(s_, join);  // ...and is joined back
  launch_host_func(s_, note("last"));
  graph_capture_end(g_);
  EXPECT_EQ(stream_capture_status(side), CaptureStatus::None);
  EXPECT_EQ(graph_node_count(g_), 4u);
  EXPECT_TRUE(log.empty());
  graph_replay(g_, s_);
  stream_synchronize(s_);
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log.front(), "first");
  EXPECT_EQ(log.back(), "last");
  // The side stream is a normal stream again.
  std::atomic<bool> ran{false};
  launch_host_func(side, [&] { ran = true; });
  stream_synchronize(side);
  EXPECT_TRUE(ran.load());
  event_destroy(fork);
  event_destroy(join);
  stream_destroy(side);
}

TEST_F(GraphTest, UnjoinedStreamFailsTheCaptureAndLeavesStreamsUsable) {
  Stream side = stream_create(0);
  Event fork = event_create(0);
  graph_capture_begin(g_, s_);
  event_record(fork, s_);
  stream_wait_event(side, fork);
  launch_host_func(side, [] {});
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "joined back into the origin stream");
  EXPECT_EQ(stream_capture_status(side), CaptureStatus::None);
  EXPECT_EQ(stream_capture_status(s_), CaptureStatus::None);
  std::atomic<int> runs{0};  // two streams run concurrently
  launch_host_func(side, [&] { runs.fetch_add(1); });
  launch_host_func(s_, [&] { runs.fetch_add(1); });
  stream_synchronize(side);
  stream_synchronize(s_);
  EXPECT_EQ(runs.load(), 2);
  // The graph is empty again and can capture.
  graph_capture_begin(g_, s_);
  graph_capture_end(g_);
  event_destroy(fork);
  stream_destroy(side);
}

// Every synchronizing call on a capturing stream fails, invalidates the capture, and leaves
// the stream usable once the capture is ended.
TEST_F(GraphTest, SynchronizingCallsInvalidateTheCapture) {
  struct Case {
    const char* name;
    std::function<void(Stream, Event)> call;
  };
  std::vector<float> host(4, 0.f);
  const std::vector<Case> cases = {
      {"stream_synchronize", [](Stream s, Event) { stream_synchronize(s); }},
      {"stream_query", [](Stream s, Event) { stream_query(s); }},
      {"event_query",
       [](Stream s, Event e) {
         event_record(e, s);
         event_query(e);
       }},
      {"event_synchronize",
       [](Stream s, Event e) {
         event_record(e, s);
         event_synchronize(e);
       }},
      {"memcpy",
       [&host](Stream s, Event) {
         DeviceBuffer d(16, s);
         set_current_stream(s);
         struct Restore {
           ~Restore() { set_current_stream(default_stream(0)); }
         } restore;
         memcpy(host.data(), d.get(), 16);
       }},
      {"memcpy_async with pageable host memory",
       [&host](Stream s, Event) {
         DeviceBuffer d(16, s);
         memcpy_async(d.get(), host.data(), 16, CopyKind::HostToDevice, s);
       }},
      {"device_synchronize", [](Stream, Event) { device_synchronize(0); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Event e = event_create(0);
    graph_capture_begin(g_, s_);
    EXPECT_RT_ERROR(c.call(s_, e), CaptureError, "is not allowed while a graph capture");
    EXPECT_RT_ERROR(c.call(s_, e), CaptureError, c.name);
    EXPECT_EQ(stream_capture_status(s_), CaptureStatus::Invalidated);
    EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError,
                    std::string("the capture was invalidated by ") + c.name);
    EXPECT_EQ(stream_capture_status(s_), CaptureStatus::None);
    EXPECT_RT_ERROR(graph_replay(g_, s_), InvalidValueError, "the graph is empty");
    // Usable again: eager work runs, and a clean capture succeeds.
    int ran = 0;
    launch_host_func(s_, [&] { ++ran; });
    stream_synchronize(s_);
    EXPECT_EQ(ran, 1);
    graph_capture_begin(g_, s_);
    launch_host_func(s_, [&] { ++ran; });
    graph_capture_end(g_);
    graph_replay(g_, s_);
    stream_synchronize(s_);
    EXPECT_EQ(ran, 2);
    graph_reset(g_);
    event_destroy(e);
  }
}

TEST_F(GraphTest, CaptureModesGovernDeviceSynchronizationFromOtherThreads) {
  auto sync_from_thread = [] {
    return testing::capture_error_from_thread([] { device_synchronize(0); });
  };
  // Global: another thread's device synchronization is refused and invalidates the capture.
  graph_capture_begin(g_, s_, {}, CaptureMode::Global);
  EXPECT_NE(sync_from_thread().find("capture mode global"), std::string::npos);
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "invalidated by device_synchronize");
  // Thread-local: other threads may synchronize (capturing streams are skipped)...
  graph_capture_begin(g_, s_, {}, CaptureMode::ThreadLocal);
  EXPECT_EQ(sync_from_thread(), "");
  EXPECT_EQ(stream_capture_status(s_), CaptureStatus::Active);
  // ...the capturing thread may not.
  EXPECT_RT_ERROR(device_synchronize(0), CaptureError, "capture mode thread_local");
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "invalidated");
  // Relaxed: device synchronization is allowed everywhere.
  graph_capture_begin(g_, s_, {}, CaptureMode::Relaxed);
  device_synchronize(0);
  EXPECT_EQ(sync_from_thread(), "");
  launch_host_func(s_, [] {});
  graph_capture_end(g_);
  EXPECT_EQ(graph_node_count(g_), 1u);
  // CUDA's rule is per thread, not per device: synchronizing another device from a thread
  // with a capture underway is refused too, unless the capture is relaxed.
  graph_reset(g_);
  graph_capture_begin(g_, s_);
  EXPECT_RT_ERROR(device_synchronize(1), CaptureError, "device_synchronize(device 1)");
  EXPECT_RT_ERROR(graph_capture_end(g_), CaptureError, "invalidated");
  graph_capture_begin(g_, s_, {}, CaptureMode::Relaxed);
  device_synchronize(1);
  graph_capture_end(g_);
}

TEST_F(GraphTest, WaitingOnEagerWorkInsideACapture) {
  Event done = event_create(0), pending = event_create(0);
  event_record(done, default_stream(0));
  event_synchronize(done);
  Gate gate;
  const bool async = !launch_blocking();
  if (async) {
    launch_host_func(default_stream(0), [&] { gate.wait(); });
    event_record(pending, default_stream(0));
  }
  graph_capture_begin(g_, s_);
  stream_wait_event(s_, done);  // already complete: nothing to depend on
  if (async) {
    EXPECT_RT_ERROR(stream_wait_event(s_, pending), CaptureError,
                    "recorded outside the capture and has not completed");
  }
  launch_host_func(s_, [] {});
  graph_capture_end(g_);
  gate.open();
  device_synchronize(0);
  event_destroy(done);
  event_destroy(pending);
}

TEST_F(GraphTest, AnEventLastRecordedInAnEndedCaptureIsRefusedUntilRecordedAgain) {
  // CUDA refuses such an event (cudaErrorCapturedEvent): its record is a graph node, not work.
  Event e = event_create(0, /*enable_timing=*/true);
  Event eager = event_create(0, /*enable_timing=*/true);
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [] {});
  event_record(e, s_);
  graph_capture_end(g_);
  const char* why = "last recorded during a capture, which has ended";
  EXPECT_RT_ERROR(event_query(e), CaptureError, why);
  EXPECT_RT_ERROR(event_synchronize(e), CaptureError, why);
  event_record(eager, s_);
  event_synchronize(eager);
  EXPECT_RT_ERROR(event_elapsed_time(eager, e), CaptureError, why);
  EXPECT_RT_ERROR(stream_wait_event(s_, e), CaptureError, why);
  event_record(e, s_);  // recorded eagerly: an ordinary event again
  event_synchronize(e);
  EXPECT_TRUE(event_query(e));
  EXPECT_GE(event_elapsed_time(eager, e), 0.f);
  event_destroy(e);
  event_destroy(eager);
  // Events recycled after a capture answer as fresh ones.
  Event fresh = event_create(0);
  EXPECT_TRUE(event_query(fresh));
  event_destroy(fresh);
}

TEST_F(GraphTest, PinnedCopiesAreCapturedAndRepeated) {
  auto* pinned = static_cast<float*>(host_malloc(16 * sizeof(float)));
  float* dev = static_cast<float*>(malloc(16 * sizeof(float), s_));
  graph_capture_begin(g_, s_);
  // Through device memory and back, then doubled on the host (a host task may touch pinned
  // memory on every driver).
  memcpy_async(dev, pinned, 16 * sizeof(float), CopyKind::HostToDevice, s_);
  memcpy_async(pinned, dev, 16 * sizeof(float), CopyKind::DeviceToHost, s_);
  launch_host_func(s_, [pinned] {
    for (int i = 0; i < 16; ++i) pinned[i] *= 2.f;
  });
  graph_capture_end(g_);
  EXPECT_EQ(graph_node_count(g_), 3u);
  for (int i = 0; i < 16; ++i) pinned[i] = float(i);
  graph_replay(g_, s_);
  graph_replay(g_, s_);  // reads what the first replay wrote back
  stream_synchronize(s_);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(pinned[i], float(4 * i));
  free(dev);
  host_free(pinned);
}

TEST_F(GraphTest, ReplaysOfOneGraphNeverOverlap) {
  std::atomic<int> inside{0}, overlaps{0}, runs{0};
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [&] {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    inside.fetch_sub(1);
    runs.fetch_add(1);
  });
  graph_capture_end(g_);
  std::vector<Stream> streams;
  for (int i = 0; i < 4; ++i) streams.push_back(stream_create(0));
  for (int r = 0; r < 5; ++r) {
    for (Stream s : streams) graph_replay(g_, s);
  }
  for (Stream s : streams) {
    stream_synchronize(s);
    stream_destroy(s);
  }
  EXPECT_EQ(runs.load(), 20);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST_F(GraphTest, AGraphCanBeReplayedInsideAnotherCapture) {
  int runs = 0;
  graph_capture_begin(g_, s_);
  launch_host_func(s_, [&] { ++runs; });
  graph_capture_end(g_);
  Graph outer = graph_create();
  graph_capture_begin(outer, s_);
  graph_replay(g_, s_);
  graph_replay(g_, s_);
  graph_capture_end(outer);
  EXPECT_EQ(runs, 0);
  graph_replay(outer, s_);
  graph_replay(outer, s_);
  stream_synchronize(s_);
  EXPECT_EQ(runs, 4);
  graph_destroy(outer);
}

TEST_F(GraphTest, FreeOfAStreamUsedBlockDuringCaptureWaitsForTheCaptureToEnd) {
  Stream user = stream_create(0);
  void* p = malloc(4096, user);
  record_stream(p, s_);
  graph_capture_begin(g_, s_);
  const DeviceStats before = memory_stats(0);
  free(p);  // s_ is capturing: no event can be recorded on it now
  const DeviceStats after = memory_stats(0);
  EXPECT_EQ(after.allocation[kAggregate].current, before.allocation[kAggregate].current - 1);
  EXPECT_EQ(after.active[kAggregate].current, before.active[kAggregate].current);  // still held
  launch_host_func(s_, [] {});
  graph_capture_end(g_);
  stream_synchronize(s_);
  void* q = malloc(4096, user);  // processed after the capture: reusable again
  EXPECT_EQ(q, p);
  free(q);
  stream_destroy(user);
}

TEST_F(GraphTest, BlocksOfOtherDevicesUsedByTheCapturingStreamAlsoWait) {
  Stream user = stream_create(1);
  void* p = malloc(4096, user);  // device 1 memory, also used by s_ on device 0
  record_stream(p, s_);
  graph_capture_begin(g_, s_);
  const DeviceStats before = memory_stats(1);
  free(p);
  EXPECT_EQ(memory_stats(1).active[kAggregate].current, before.active[kAggregate].current);
  void* other = malloc(4096, user);
  EXPECT_NE(other, p);  // not reusable while s_ captures
  free(other);
  launch_host_func(s_, [] {});
  graph_capture_end(g_);
  stream_synchronize(s_);
  void* q = malloc(4096, user);
  EXPECT_EQ(q, p);
  free(q);
  stream_destroy(user);
}

TEST_F(GraphTest, DestroyingAGraphMidCaptureEndsTheCapture) {
  Graph g = graph_create();
  Stream s = stream_create(0);
  graph_capture_begin(g, s);
  launch_host_func(s, [] {});
  graph_destroy(g);
  EXPECT_EQ(stream_capture_status(s), CaptureStatus::None);
  EXPECT_FALSE(device_is_capturing(0));
  int ran = 0;
  launch_host_func(s, [&] { ran = 1; });
  stream_synchronize(s);
  EXPECT_EQ(ran, 1);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
