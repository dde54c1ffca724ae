// Events: record, query, synchronize, cross-stream and cross-device waits, timing.
#include <atomic>
#include <chrono>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

using testing::expect_wait_orders;
using testing::Gate;

TEST(Event, UnrecordedEventIsComplete) {
  Event e = event_create();
  EXPECT_TRUE(event_query(e));
  event_synchronize(e);                     // returns at once
  stream_wait_event(default_stream(0), e);  // no-op
  event_destroy(e);
}

TEST(Event, RecordQuerySynchronize) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s = stream_create();
  Event e = event_create();
  Gate gate;
  launch_host_func(s, [&] { gate.wait(); });
  event_record(e, s);
  EXPECT_FALSE(event_query(e));
  gate.open();
  event_synchronize(e);
  EXPECT_TRUE(event_query(e));
  event_destroy(e);
  stream_destroy(s);
}

TEST(Event, WaitOrdersWorkAcrossStreams) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream producer = stream_create(), consumer = stream_create();
  Event ready = event_create();
  expect_wait_orders(producer, consumer, ready);
  event_destroy(ready);
  stream_destroy(producer);
  stream_destroy(consumer);
}

TEST(Event, WaitOrdersWorkAcrossDevices) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream s0 = stream_create(0), s1 = stream_create(1);
  Event e = event_create(0);
  expect_wait_orders(s0, s1, e);
  EXPECT_EQ(event_device(e), 0);
  event_destroy(e);
  stream_destroy(s0);
  stream_destroy(s1);
}

TEST(Event, WaitUsesTheRecordAtTheTimeOfTheWait) {
  SKIP_IF_LAUNCH_BLOCKING();
  Stream a = stream_create(), b = stream_create();
  Event e = event_create();
  event_record(e, a);
  event_synchronize(e);
  stream_wait_event(b, e);  // satisfied already
  Gate gate;
  launch_host_func(a, [&] { gate.wait(); });
  event_record(e, a);  // a later record does not affect the earlier wait
  std::atomic<bool> ran{false};
  launch_host_func(b, [&] { ran = true; });
  stream_synchronize(b);
  EXPECT_TRUE(ran.load());
  gate.open();
  stream_synchronize(a);
  event_destroy(e);
  stream_destroy(a);
  stream_destroy(b);
}

TEST(Event, ElapsedTimeMeasuresStreamTime) {
  Stream s = stream_create();
  Event start = event_create(0, true), end = event_create(0, true);
  event_record(start, s);
  launch_host_func(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); });
  event_record(end, s);
  event_synchronize(end);
  const float ms = event_elapsed_time(start, end);
  EXPECT_GE(ms, 19.0f);
  EXPECT_LT(ms, 2000.0f);
  EXPECT_LE(event_elapsed_time(end, start), -19.0f);
  event_destroy(start);
  event_destroy(end);
  stream_destroy(s);
}

TEST(Event, ElapsedTimeErrors) {
  Event plain = event_create(0, false), timed = event_create(0, true),
        unrecorded = event_create(0, true), other = event_create(1, true);
  event_record(plain, default_stream(0));
  event_record(timed, default_stream(0));
  event_record(other, default_stream(1));
  device_synchronize(-2);
  EXPECT_RT_ERROR(event_elapsed_time(plain, timed), InvalidValueError,
                  "start event was created without timing");
  EXPECT_RT_ERROR(event_elapsed_time(timed, plain), InvalidValueError,
                  "end event was created without timing");
  EXPECT_RT_ERROR(event_elapsed_time(timed, unrecorded), InvalidValueError,
                  "end event has not been recorded");
  EXPECT_RT_ERROR(event_elapsed_time(timed, other), InvalidValueError, "different devices");
  if (!launch_blocking()) {
    Gate gate;
    launch_host_func(default_stream(0), [&] { gate.wait(); });
    Event pending = event_create(0, true);
    event_record(pending, default_stream(0));
    EXPECT_RT_ERROR(event_elapsed_time(timed, pending), NotReadyError, "has not completed yet");
    gate.open();
    event_synchronize(pending);
    event_destroy(pending);
  }
  for (Event e : {plain, timed, unrecorded, other}) event_destroy(e);
}

TEST(Event, DestroyedEventIsAnInvalidHandle) {
  Event e = event_create();
  event_destroy(e);
  EXPECT_RT_ERROR(event_query(e), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(event_record(e, default_stream(0)), InvalidHandleError, "event_record");
  EXPECT_RT_ERROR(stream_wait_event(default_stream(0), e), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(event_destroy(e), InvalidHandleError, "was destroyed");
  EXPECT_RT_ERROR(event_query(Event::from_bits((uint64_t{123456} << 32) | 1)), InvalidHandleError,
                  "not a valid event");
  EXPECT_RT_ERROR(event_query(Event{}), InvalidHandleError, "event");
}

TEST(Event, RecordOnAnotherDevicesStreamIsRefused) {
  Event e = event_create(0);
  EXPECT_RT_ERROR(event_record(e, default_stream(1)), InvalidValueError,
                  "the event belongs to device 0");
  event_destroy(e);
}

TEST(Event, RecycledEventsBehaveLikeNewOnes) {
  for (int i = 0; i < 100; ++i) {
    Event e = event_create(i % 2, i % 3 == 0);
    EXPECT_TRUE(event_query(e));
    event_record(e, default_stream(i % 2));
    event_synchronize(e);
    event_destroy(e);
  }
}

}  // namespace
}  // namespace accel::rt
