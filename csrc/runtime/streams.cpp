// Streams and events: the public calls, and the runtime's own device-wide synchronization.
#include <algorithm>
#include <array>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"

namespace accel::rt {
namespace detail {

namespace {
// The calling thread's current stream per device.
thread_local std::array<uint64_t, kMaxDevices> t_stream{};
thread_local uint64_t t_stream_set = 0;  // bit d: t_stream[d] holds the current stream
}  // namespace

StreamObj& Runtime::current_stream_obj(int device) {
  if (t_stream_set & (uint64_t{1} << device)) {
    return stream(Stream::from_bits(t_stream[device]), "current stream");
  }
  return default_stream_obj(device);
}

void Runtime::synchronize_streams(int device, bool skip_capturing) {
  // Waits through events so that task failures stay reported to whoever synchronizes next.
  DeviceState& ds = *devices[device];
  const uint32_t n = ds.streams.size();
  for (uint32_t slot = 0; slot < n; ++slot) {
    StreamObj* s = ds.streams.get(slot);
    if (s == nullptr || !s->live.load()) continue;
    if (s->capturing.load() && skip_capturing) continue;
    if (driver->stream_query(s->ds)) continue;
    DriverEvent ev = pool_event(device);
    driver->event_record(ev, s->ds);
    driver->event_synchronize(ev);
    return_event(device, ev);
  }
}

DriverEvent Runtime::pool_event(int device) {
  DeviceState& ds = *devices[device];
  {
    std::lock_guard<std::mutex> lock(ds.event_pool_mutex);
    if (!ds.event_pool.empty()) {
      DriverEvent ev = ds.event_pool.back();
      ds.event_pool.pop_back();
      return ev;
    }
  }
  return driver->event_create(device, false);
}

void Runtime::return_event(int device, DriverEvent ev) {
  DeviceState& ds = *devices[device];
  std::lock_guard<std::mutex> lock(ds.event_pool_mutex);
  ds.event_pool.push_back(ev);
}

}  // namespace detail

using detail::Runtime;
using detail::StreamObj;

// --- streams ------------------------------------------------------------------------------

std::pair<int, int> stream_priority_range() {
  return Runtime::get().priority_range;
}

namespace {
int clamp_priority(Runtime& rt, int priority) {
  const auto [least, greatest] = rt.priority_range;
  return std::clamp(priority, greatest, least);
}
}  // namespace

Stream default_stream(int device) {
  Runtime& rt = Runtime::get();
  return rt.default_stream_obj(rt.resolve_device(device, "default_stream")).handle();
}

Stream stream_create(int device, int priority) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "stream_create");
  StreamObj* obj = rt.acquire_stream(d, clamp_priority(rt, priority), /*pooled=*/false);
  return obj->handle();
}

void stream_destroy(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_destroy");
  ACCEL_RT_CHECK(s.slot != 0, InvalidValueError, "stream_destroy: ", detail::describe(stream),
                 " cannot be destroyed");
  ACCEL_RT_CHECK(!s.pooled, InvalidValueError, "stream_destroy: ", detail::describe(stream),
                 " comes from the stream pool, which owns it");
  ACCEL_RT_CHECK(!s.external, InvalidValueError, "stream_destroy: ", detail::describe(stream),
                 " wraps a native stream that another library created; destroy it there");
  ACCEL_RT_CHECK(!s.capturing.load(), CaptureError, "stream_destroy: ", detail::describe(stream),
                 " is capturing a graph; end the capture first");
  std::string failure;
  try {
    rt.driver->stream_synchronize(s.ds);
  } catch (const TaskError& e) {
    failure = e.message();
  } catch (const DeviceLostError&) {
    // Nothing runs on a lost device again: the handle is released all the same.
  }
  // The driver stream is kept for reuse by a later stream_create: a racing user of the stale
  // handle can then never touch freed memory.
  s.retire();
  rt.devices[s.device]->streams.release(s.slot);
  ACCEL_RT_CHECK(failure.empty(), TaskError, "stream_destroy: ", failure);
}

Stream stream_from_pool(int device, int priority) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "stream_from_pool");
  const int p = clamp_priority(rt, priority);
  const int level = std::min(-(p - rt.priority_range.first), detail::kMaxPriorityLevels - 1);
  detail::DeviceState& ds = *rt.devices[d];
  const uint32_t idx = ds.pool_next[level].fetch_add(1) % detail::kPoolStreamsPerPriority;
  StreamObj* obj = ds.pool[level][idx].load(std::memory_order_acquire);
  if (obj == nullptr) {
    std::lock_guard<std::mutex> lock(ds.pool_mutex);
    obj = ds.pool[level][idx].load();
    if (obj == nullptr) {
      obj = rt.acquire_stream(d, p, /*pooled=*/true);
      ds.pool[level][idx].store(obj, std::memory_order_release);
    }
  }
  return obj->handle();
}

int stream_priority(Stream stream) {
  return Runtime::get().stream(stream, "stream_priority").priority;
}

Stream current_stream(int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "current_stream");
  if (detail::t_stream_set & (uint64_t{1} << d)) return Stream::from_bits(detail::t_stream[d]);
  return rt.default_stream_obj(d).handle();
}

void set_current_stream(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "set_current_stream");
  detail::t_stream[s.device] = stream.bits();
  detail::t_stream_set |= uint64_t{1} << s.device;
}

void stream_check(Stream stream) {
  Runtime::get().stream(stream, "stream_check");
}

void* stream_native_handle(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_native_handle");
  void* handle = rt.capabilities.native_handles ? rt.driver->stream_native_handle(s.ds) : nullptr;
  ACCEL_RT_CHECK(handle != nullptr, NotSupportedError, "stream_native_handle: the ",
                 rt.driver->name(), " driver has no native stream handle");
  return handle;
}

namespace {
// The live stream of `ds` whose native handle is `handle` (adopted ones included), or nullptr.
StreamObj* stream_with_native(Runtime& rt, detail::DeviceState& ds, void* handle) {
  for (uint32_t slot = 0, n = ds.streams.size(); slot < n; ++slot) {
    StreamObj* s = ds.streams.get(slot);
    if (s != nullptr && s->live.load() && rt.driver->stream_native_handle(s->ds) == handle) {
      return s;
    }
  }
  return nullptr;
}
}  // namespace

Stream stream_from_native(void* handle, int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "stream_from_native");
  ACCEL_RT_CHECK(handle != nullptr, InvalidValueError,
                 "stream_from_native: a null handle names no stream (CUDA's legacy default "
                 "stream is not one accel runs work on); pass a created stream's handle");
  ACCEL_RT_CHECK(rt.capabilities.native_handles, NotSupportedError, "stream_from_native: the ",
                 rt.driver->name(), " driver has no native stream handles");
  detail::DeviceState& ds = *rt.devices[d];
  // The stream with that handle: one of accel's own, or one adopted earlier (a stream destroyed
  // since does not count, though its driver stream is kept for reuse). Under the lock, so that
  // a handle is adopted once.
  std::lock_guard<std::mutex> lock(ds.pool_mutex);
  if (StreamObj* s = stream_with_native(rt, ds, handle)) return s->handle();
  for (int other = 0; other < rt.num_devices; ++other) {
    if (other == d) continue;
    const StreamObj* s = stream_with_native(rt, *rt.devices[other], handle);
    ACCEL_RT_CHECK(s == nullptr, InvalidValueError, "stream_from_native: the handle is that of ",
                   detail::describe(s->handle()), ", not of a stream of device ", d);
  }
  int priority = 0;
  DriverStream adopted = nullptr;
  try {
    adopted = rt.driver->stream_adopt(d, handle, &priority);
  } catch (const NotSupportedError& e) {
    ACCEL_RT_THROW(NotSupportedError, "stream_from_native: ", format_ptr(handle),
                   " is not the handle of a live accel stream of device ", d, ", and ",
                   e.message());
  }
  StreamObj* obj = ds.streams.acquire([](StreamObj&) { return false; },
                                      [&](uint32_t slot) {
                                        auto s = std::make_unique<StreamObj>();
                                        s->device = d;
                                        s->slot = slot;
                                        s->priority = priority;
                                        s->external = true;
                                        s->ds = adopted;
                                        return s.release();
                                      });
  obj->live.store(true, std::memory_order_release);
  return obj->handle();
}

void launch_host_func(Stream stream, Task task, const char* label) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(static_cast<bool>(task), InvalidValueError, "launch_host_func: empty task");
  ACCEL_RT_CHECK(rt.capabilities.host_functions, NotSupportedError, "launch_host_func: the ",
                 rt.driver->name(), " driver cannot run host functions in stream order");
  StreamObj& s = rt.stream(stream, "launch_host_func");
  if (trace::enabled() && !s.capturing.load(std::memory_order_relaxed)) {
    task = trace::wrap(std::move(task), stream, label);
  }
  rt.driver->launch_host_func(s.ds, std::move(task), label);
}

bool stream_query(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_query");
  rt.check_not_capturing(s, "stream_query");
  return rt.driver->stream_query(s.ds);
}

void stream_synchronize(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_synchronize");
  rt.check_not_capturing(s, "stream_synchronize");
  rt.driver->stream_synchronize(s.ds);
}

// --- events -------------------------------------------------------------------------------

Event event_create(int device, bool enable_timing) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "event_create");
  ACCEL_RT_CHECK(!enable_timing || rt.capabilities.timing_events, NotSupportedError,
                 "event_create: the ", rt.driver->name(),
                 " driver has no timing events; create the event with enable_timing=False");
  detail::EventObj* obj = rt.events.acquire(
      [&](detail::EventObj& e) {
        // Reuse only an event whose previous records have all completed: it then behaves
        // exactly like a fresh one.
        // No query while a capture is underway (CUDA forbids it): a fresh event then.
        return e.device == d && e.timing == enable_timing && !e.interprocess &&
               !rt.capturing_anywhere() && rt.driver->event_query(e.de);
      },
      [&](uint32_t slot) {
        auto e = std::make_unique<detail::EventObj>();  // freed if the driver refuses
        e->slot = slot;
        e->device = d;
        e->timing = enable_timing;
        e->de = rt.driver->event_create(d, enable_timing);
        return e.release();
      });
  obj->recorded.store(false);
  obj->capture_id.store(0);
  obj->live.store(true, std::memory_order_release);
  return obj->handle();
}

void event_destroy(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_destroy");
  // An event last recorded in a capture is a graph node to CUDA, not a record: querying it
  // before an eager record fails (cudaErrorCapturedEvent), so event_create could not recycle it.
  // A fresh driver event takes its place, as it does for an interprocess event (whose state
  // other processes may still share).
  if (e.ipc_own) detail::forget_own_ipc_event(e.ipc_handle);
  e.ipc_own = false;
  if (e.capture_id.load(std::memory_order_acquire) != 0 || e.interprocess) {
    DriverEvent fresh = rt.driver->event_create(e.device, e.timing);
    rt.driver->event_destroy(e.de);
    e.de = fresh;
    e.interprocess = false;
  }
  e.retire();
  rt.events.release(e.slot);
}

int event_device(Event event) {
  return Runtime::get().event(event, "event_device").device;
}

void event_record(Event event, Stream stream) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_record");
  StreamObj& s = rt.stream(stream, "event_record");
  ACCEL_RT_CHECK(e.device == s.device, InvalidValueError,
                 "event_record: the event belongs to "
                 "device ",
                 e.device, " but ", detail::describe(stream), " is on device ", s.device,
                 "; create the event on the stream's device");
  if (e.interprocess) {
    rt.refuse_capture(s, "event_record of an interprocess event",
                      "other processes cannot follow a record inside a graph");
  }
  if (s.capturing.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(rt.capture_mutex);
    if (s.capture != nullptr) {
      rt.driver->event_record(e.de, s.ds);
      e.capture_id.store(s.capture->id);
      e.recorded.store(true);
      return;
    }
  }
  rt.driver->event_record(e.de, s.ds);
  e.capture_id.store(0);
  e.recorded.store(true);
}

void stream_wait_event(Stream stream, Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "stream_wait_event");
  StreamObj& s = rt.stream(stream, "stream_wait_event");
  if (const uint64_t id = e.capture_id.load(std::memory_order_acquire); id != 0) {
    {
      std::lock_guard<std::mutex> lock(rt.capture_mutex);
      auto it = rt.live_captures.find(id);
      if (it != rt.live_captures.end()) {
        detail::CaptureState& cs = *it->second;
        ACCEL_RT_CHECK(s.capture == nullptr || s.capture == &cs, CaptureError,
                       "stream_wait_event: ", detail::describe(stream),
                       " is capturing another graph than the one the event was recorded in");
        ACCEL_RT_CHECK(s.device == cs.device, CaptureError,
                       "stream_wait_event: ", detail::describe(stream),
                       " cannot join a capture on device ", cs.device);
        rt.driver->stream_wait_event(s.ds, e.de);
        if (s.capture == nullptr) {  // the stream joins the capture
          s.capture = &cs;
          s.capturing.store(true, std::memory_order_release);
          cs.streams.push_back(&s);
        }
        return;
      }
    }
    rt.check_event_not_captured(e, "stream_wait_event");  // its capture ended: refused
  }
  if (s.capturing.load(std::memory_order_acquire)) {
    bool capturing = false;
    {
      std::lock_guard<std::mutex> lock(rt.capture_mutex);
      capturing = s.capture != nullptr;
    }
    // Eager work cannot be a dependency of a graph (CUDA refuses the wait:
    // cudaErrorStreamCaptureIsolation); work that already finished needs none, so the wait is
    // dropped. The query is one the capture allows (relaxed mode: it does not synchronize).
    if (capturing) {
      if (!e.recorded.load(std::memory_order_acquire)) return;
      bool done = false;
      {
        const detail::RelaxedCaptureMode relaxed(*rt.driver);
        done = rt.driver->event_query(e.de);
      }
      ACCEL_RT_CHECK(done, CaptureError,
                     "stream_wait_event: the event was recorded outside the capture and has not "
                     "completed; a captured stream cannot wait on eager work (wait before "
                     "capture_begin instead)");
      return;
    }
  }
  rt.driver->stream_wait_event(s.ds, e.de);
}

bool event_query(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_query");
  rt.check_event_not_captured(e, "event_query");
  return rt.driver->event_query(e.de);
}

void event_synchronize(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_synchronize");
  rt.check_event_not_captured(e, "event_synchronize");
  rt.driver->event_synchronize(e.de);
}

float event_elapsed_time(Event start, Event end) {
  Runtime& rt = Runtime::get();
  detail::EventObj& a = rt.event(start, "event_elapsed_time");
  detail::EventObj& b = rt.event(end, "event_elapsed_time");
  for (auto [e, which] : {std::pair{&a, "start"}, std::pair{&b, "end"}}) {
    ACCEL_RT_CHECK(e->timing, InvalidValueError, "event_elapsed_time: the ", which,
                   " event was created without timing; create both events with timing "
                   "enabled (enable_timing=True)");
    ACCEL_RT_CHECK(e->recorded.load(), InvalidValueError, "event_elapsed_time: the ", which,
                   " event has not been recorded");
    rt.check_event_not_captured(*e, "event_elapsed_time");
    ACCEL_RT_CHECK(rt.driver->event_query(e->de), NotReadyError, "event_elapsed_time: the ", which,
                   " event has not completed yet; synchronize it first");
  }
  ACCEL_RT_CHECK(a.device == b.device, InvalidValueError,
                 "event_elapsed_time: the events belong to different devices (", a.device, " and ",
                 b.device, ")");
  return rt.driver->event_elapsed_ms(a.de, b.de);
}

}  // namespace accel::rt
