// Streams: ordering, asynchrony, query/synchronize, pools, priorities, current stream, errors.
#include <atomic>
#include <chrono>
#include <set>
#include <stdexcept>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::Gate;

TEST(Stream, DefaultStreamHasIdZeroPerDevice) {
  for (int d = 0; d < device_count(); ++d) {
    Stream s = default_stream(d);
    EXPECT_EQ(s.device(), d);
    EXPECT_EQ(s.id(), 0u);
    EXPECT_TRUE(s.is_default());
    EXPECT_EQ(Stream::from_id(d, 0), s);
  }
  EXPECT_EQ(current_stream(0), default_stream(0));
}

TEST(Stream, NativeHandlesAreTheDriversOwn) {
  Stream a = stream_create();
  Stream b = stream_create();
  void* ha = stream_native_handle(a);
  EXPECT_NE(ha, nullptr);
  EXPECT_EQ(stream_native_handle(a), ha);
  EXPECT_NE(stream_native_handle(b), ha);
  EXPECT_NE(stream_native_handle(default_stream(0)), ha);
  stream_destroy(a);
  stream_destroy(b);
  EXPECT_RT_ERROR(stream_native_handle(a), InvalidHandleError, "stream_native_handle");
}

TEST(Stream, FromNativeHandleGivesTheAccelStreamWithThatHandle) {
  Stream a = stream_create(0);
  Stream b = stream_create(1);
  EXPECT_EQ(stream_from_native(stream_native_handle(a), 0), a);
  EXPECT_EQ(stream_from_native(stream_native_handle(b), 1), b);
  EXPECT_EQ(stream_from_native(stream_native_handle(default_stream(0)), 0), default_stream(0));
  EXPECT_RT_ERROR(stream_from_native(stream_native_handle(b), 0), InvalidValueError,
                  "not of a stream of device 0");
  EXPECT_RT_ERROR(stream_from_native(nullptr, 0), InvalidValueError, "null handle");
  EXPECT_RT_ERROR(stream_from_native(stream_native_handle(a), device_count()), InvalidDeviceError,
                  "stream_from_native");
  // A destroyed stream's handle names no live accel stream; only a driver that adopts other
  // libraries' streams could take it, and none of these takes its own stale one.
  void* stale = stream_native_handle(a);
  stream_destroy(a);
  // (A driver that adopts native streams passes the handle to its vendor runtime, where a
  // destroyed stream's handle is undefined behaviour: CUDA's.)
  if (std::string(driver_name()) != "cuda") {
    EXPECT_RT_ERROR(stream_from_native(stale, 0), NotSupportedError,
                    "is not the handle of a live accel stream of device 0");
  }
  stream_destroy(b);
}

TEST(Stream, TasksRunInSubmissionOrder) {
  Stream s = stream_create();
  std::vector<int> order;
  for (int i = 0; i < 1000; ++i) launch_host_func(s, [&order, i] { order.push_back(i); });
  stream_synchronize(s);
  ASSERT_EQ(order.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(order[i], i);
  stream_destroy(s);
}

TEST(Stream, ATaskMaySubmitWorkToItsOwnStream) {
  // Queued behind the running task, or (launch blocking) run at once; never a deadlock.
  SKIP_UNLESS_HOST_DRIVER();
  Stream s = stream_create();
  std::vector<int> order;
  launch_host_func(s, [&] {
    order.push_back(1);
    launch_host_func(s, [&order] { order.push_back(3); });
    order.push_back(2);
  });
  stream_synchronize(s);  // the first task and everything submitted before this call
  stream_synchronize(s);  // the task it submitted
  if (launch_blocking()) {
    EXPECT_EQ(order, (std::vector<int>{1, 3, 2}));
  } else {
    EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  }
  stream_destroy(s);
}

TEST(Stream, SubmissionIsAsynchronousAndQueryIsCorrectWhileATaskRuns) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  Gate gate;
  std::atomic<bool> started{false}, finished{false};
  launch_host_func(s, [&] {
    started = true;
    gate.wait();
    finished = true;
  });
  // The call returned while the task is still blocked: the caller only enqueues.
  while (!started) std::this_thread::yield();
  EXPECT_FALSE(stream_query(s));  // a running task is pending work
  EXPECT_FALSE(finished.load());
  launch_host_func(s, [] {});
  EXPECT_FALSE(stream_query(s));
  gate.open();
  stream_synchronize(s);
  EXPECT_TRUE(finished.load());
  EXPECT_TRUE(stream_query(s));
  stream_destroy(s);
}

TEST(Stream, SynchronizeWaitsOnlyForWorkSubmittedBefore) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i) {
    launch_host_func(s, [&] {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      done.fetch_add(1);
    });
  }
  stream_synchronize(s);
  EXPECT_EQ(done.load(), 100);
  stream_destroy(s);
}

TEST(Stream, StreamsRunConcurrently) {
  SKIP_IF_LAUNCH_BLOCKING();
  // A task on one stream waits for a task on another: only possible if both run at once.
  Stream a = stream_create(), b = stream_create();
  Gate gate;
  std::atomic<bool> b_ran{false};
  launch_host_func(a, [&] { gate.wait(); });
  launch_host_func(b, [&] {
    b_ran = true;
    gate.open();
  });
  stream_synchronize(a);
  stream_synchronize(b);
  EXPECT_TRUE(b_ran.load());
  stream_destroy(a);
  stream_destroy(b);
}

TEST(Stream, PoolHandsOutStreamsRoundRobinPerPriority) {
  const auto [least, greatest] = stream_priority_range();
  EXPECT_EQ(least, 0);
  EXPECT_LT(greatest, least);
  std::set<uint64_t> low, high;
  for (int i = 0; i < 64; ++i) {
    Stream s = stream_from_pool(1, 0);
    EXPECT_EQ(s.device(), 1);
    EXPECT_EQ(stream_priority(s), 0);
    low.insert(s.bits());
    Stream h = stream_from_pool(1, greatest);
    EXPECT_EQ(stream_priority(h), greatest);
    high.insert(h.bits());
  }
  EXPECT_EQ(low.size(), 32u);
  EXPECT_EQ(high.size(), 32u);
  for (uint64_t bits : low) EXPECT_EQ(high.count(bits), 0u);
  // Out-of-range priorities are clamped, as in CUDA.
  EXPECT_EQ(stream_priority(stream_create(0, -100)), greatest);
  EXPECT_EQ(stream_priority(stream_from_pool(0, 7)), least);
  // Pool streams work and cannot be destroyed.
  Stream p = stream_from_pool(0);
  std::atomic<int> ran{0};
  launch_host_func(p, [&] { ran = 1; });
  stream_synchronize(p);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_RT_ERROR(stream_destroy(p), InvalidValueError, "comes from the stream pool");
}

TEST(Stream, CurrentStreamIsPerThreadAndPerDevice) {
  Stream s0 = stream_create(0), s1 = stream_create(1);
  set_current_stream(s0);
  set_current_stream(s1);
  EXPECT_EQ(current_stream(0), s0);
  EXPECT_EQ(current_stream(1), s1);
  Stream other_thread_view;
  std::thread([&] { other_thread_view = current_stream(0); }).join();
  EXPECT_EQ(other_thread_view, default_stream(0));
  set_current_stream(default_stream(0));
  set_current_stream(default_stream(1));
  EXPECT_EQ(current_stream(0), default_stream(0));
  stream_destroy(s0);
  stream_destroy(s1);
}

TEST(Stream, DestroyedStreamIsAnInvalidHandle) {
  Stream s = stream_create();
  stream_destroy(s);
  EXPECT_RT_ERROR(launch_host_func(s, [] {}), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(stream_synchronize(s), InvalidHandleError, "stream_synchronize");
  EXPECT_RT_ERROR(stream_query(s), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(stream_destroy(s), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(set_current_stream(s), InvalidHandleError, "set_current_stream");
  EXPECT_RT_ERROR(malloc(16, s), InvalidHandleError, "malloc");
  // A recycled slot gets a new generation: the old handle stays invalid.
  Stream t = stream_create();
  EXPECT_NE(t, s);
  EXPECT_RT_ERROR(stream_query(s), InvalidHandleError, "was destroyed");
  EXPECT_TRUE(stream_query(t));
  stream_destroy(t);
  // Handles that never existed.
  EXPECT_RT_ERROR(stream_query(Stream::from_id(0, (uint64_t{999999} << 32) | 1)),
                  InvalidHandleError, "not a valid stream");
  EXPECT_RT_ERROR(stream_query(Stream::from_id(40, 0)), InvalidHandleError,
                  "device 40 does not exist");
  EXPECT_RT_ERROR(stream_destroy(default_stream(0)), InvalidValueError, "cannot be destroyed");
}

TEST(Stream, DestroyWaitsForPendingWork) {
  Stream s = stream_create();
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i) launch_host_func(s, [&] { done.fetch_add(1); });
  stream_destroy(s);
  EXPECT_EQ(done.load(), 50);
}

TEST(Stream, FailingTaskIsReportedAndTheStreamStaysUsable) {
  Stream s = stream_create();
  auto fail = [] { throw std::runtime_error("kernel exploded"); };
  if (launch_blocking()) {
    // Launch blocking surfaces the failure at the submitting call.
    EXPECT_THROW(launch_host_func(s, fail), std::runtime_error);
  } else {
    launch_host_func(s, fail);
    EXPECT_RT_ERROR(stream_synchronize(s), TaskError, "kernel exploded");
  }
  std::atomic<int> ran{0};
  launch_host_func(s, [&] { ran = 1; });
  stream_synchronize(s);  // the error was reported once; the stream works again
  EXPECT_EQ(ran.load(), 1);
  stream_destroy(s);
}

TEST(Stream, SynchronizingFromATaskOnTheSameStreamIsRefused) {
  SKIP_UNLESS_HOST_DRIVER();
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  std::string message;
  launch_host_func(s, [&] {
    try {
      stream_synchronize(s);
    } catch (const InvalidValueError& e) {
      message = e.what();
    }
  });
  stream_synchronize(s);
  EXPECT_NE(message.find("would wait for itself"), std::string::npos) << message;
  stream_destroy(s);
}

TEST(Stream, EmptyTaskIsRejected) {
  EXPECT_RT_ERROR(launch_host_func(default_stream(0), Task{}), InvalidValueError, "empty task");
}

TEST(Stream, LargeCallablesAreStoredOnTheHeap) {
  std::array<char, 200> payload{};
  payload[199] = 7;
  int seen = 0;
  launch_host_func(default_stream(0), [payload, &seen] { seen = payload[199]; });
  stream_synchronize(default_stream(0));
  EXPECT_EQ(seen, 7);
}

}  // namespace
}  // namespace accel::rt
