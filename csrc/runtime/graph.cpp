// Graph objects: capture on a stream, instantiate, replay, reset; private memory pools.
#include <sstream>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"

namespace accel::rt {

using detail::CaptureState;
using detail::GraphObj;
using detail::Runtime;
using detail::StreamObj;

namespace {

// Ends the capture of `g` (caller holds g.m): every stream leaves capture mode, frees deferred
// during the capture are processed. Returns the driver graph (nullptr if the driver failed)
// and the reason the capture was invalidated ("" if it was not).
DriverGraph finish_capture(Runtime& rt, GraphObj& g, std::exception_ptr& driver_error,
                           std::string& invalidated) {
  CaptureState& cs = *g.capture;
  DriverGraph dg = nullptr;
  {
    std::lock_guard<std::mutex> lock(rt.capture_mutex);
    try {
      dg = rt.driver->stream_end_capture(cs.origin->ds);
    } catch (...) {
      driver_error = std::current_exception();
    }
    for (StreamObj* s : cs.streams) {
      s->capture = nullptr;
      s->capturing.store(false, std::memory_order_release);
    }
    rt.live_captures.erase(cs.id);
    g.kept.insert(g.kept.end(), cs.kept.begin(), cs.kept.end());
    g.kept_host.insert(g.kept_host.end(), cs.kept_host.begin(), cs.kept_host.end());
    rt.devices[cs.device]->captures.fetch_sub(1);
    invalidated = cs.invalidated;
  }
  // Blocks of any device may have waited for this capture's streams (record_stream).
  for (auto& device : rt.devices) device->allocator->capture_ended();
  g.capture.reset();
  return dg;
}

void release_graph(Runtime& rt, GraphObj& g) {
  if (g.exec != nullptr) rt.driver->graph_exec_destroy(g.exec);
  if (g.dg != nullptr) rt.driver->graph_destroy(g.dg);
  g.exec = nullptr;
  g.dg = nullptr;
  g.nodes = 0;
  if (!g.kept.empty()) rt.devices[g.device]->allocator->unkeep_segments(g.kept);
  g.kept.clear();
  if (!g.kept_host.empty()) rt.host_allocator->unkeep_blocks(g.kept_host);
  g.kept_host.clear();
  if (g.holds_pool) rt.devices[g.device]->allocator->release_pool(g.pool);
  g.holds_pool = false;
  g.state = GraphObj::State::Empty;
}

// Drops whatever the graph holds, aborting a capture in progress (caller holds g.m).
void reset_locked(Runtime& rt, GraphObj& g) {
  if (g.state == GraphObj::State::Capturing) {
    std::exception_ptr ignored;
    std::string reason;
    g.dg = finish_capture(rt, g, ignored, reason);
  }
  release_graph(rt, g);
}

}  // namespace

PoolId graph_pool_handle() {
  Runtime& rt = Runtime::get();
  return PoolId{0, rt.next_pool_id.fetch_add(1)};
}

Graph graph_create() {
  Runtime& rt = Runtime::get();
  GraphObj* g = rt.graphs.acquire([](GraphObj&) { return true; },
                                  [](uint32_t slot) {
                                    auto* obj = new GraphObj;
                                    obj->slot = slot;
                                    return obj;
                                  });
  g->live.store(true, std::memory_order_release);
  return g->handle();
}

void graph_destroy(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_destroy");
  {
    std::lock_guard<std::mutex> lock(g.m);
    reset_locked(rt, g);
    g.retire();
  }
  rt.graphs.release(g.slot);
}

void graph_capture_begin(Graph graph, Stream stream, PoolId pool, CaptureMode mode) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(rt.capabilities.graphs, NotSupportedError, "graph_capture_begin: the ",
                 rt.driver->name(), " driver cannot capture streams into graphs");
  GraphObj& g = rt.graph(graph, "graph_capture_begin");
  StreamObj& s = rt.stream(stream, "graph_capture_begin");
  std::lock_guard<std::mutex> glock(g.m);
  ACCEL_RT_CHECK(g.state != GraphObj::State::Capturing, CaptureError,
                 "graph_capture_begin: a capture into this graph is already underway");
  ACCEL_RT_CHECK(g.state == GraphObj::State::Empty, CaptureError,
                 "graph_capture_begin: the graph already holds a capture; call graph_reset "
                 "before capturing into it again");
  ACCEL_RT_CHECK(s.slot != 0, CaptureError, "graph_capture_begin: ", detail::describe(stream),
                 " cannot be captured; capture on a stream from stream_create or "
                 "stream_from_pool");

  const uint64_t id = rt.next_capture_id.fetch_add(1);
  const PoolId pid = pool.is_default() ? PoolId{id, 0} : pool;
  auto cs = std::make_unique<CaptureState>();
  cs->id = id;
  cs->device = s.device;
  cs->origin = &s;
  cs->mode = mode;
  cs->thread = std::this_thread::get_id();
  cs->pool = pid;
  cs->streams.push_back(&s);

  // Hold the pool before any allocation on the capturing stream can reach it.
  detail::CachingAllocator& alloc = *rt.devices[s.device]->allocator;
  alloc.use_pool(pid);
  // The pool is let go outside capture_mutex: the allocator takes that mutex under its own
  // (Runtime::check_unsafe_call), so the two are never taken in the other order.
  std::exception_ptr failed;
  {
    std::lock_guard<std::mutex> lock(rt.capture_mutex);
    try {
      ACCEL_RT_CHECK(s.capture == nullptr, CaptureError,
                     "graph_capture_begin: ", detail::describe(stream),
                     " is already capturing a graph");
      rt.driver->stream_begin_capture(s.ds, mode);
      s.capture = cs.get();
      s.capturing.store(true, std::memory_order_release);
      rt.live_captures[id] = cs.get();
      rt.devices[s.device]->captures.fetch_add(1);
    } catch (...) {
      failed = std::current_exception();
    }
  }
  if (failed) {
    alloc.release_pool(pid);
    std::rethrow_exception(failed);
  }
  g.capture = std::move(cs);
  g.state = GraphObj::State::Capturing;
  g.device = s.device;
  g.pool = pid;
  g.holds_pool = true;
}

void graph_capture_end(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_capture_end");
  std::lock_guard<std::mutex> glock(g.m);
  ACCEL_RT_CHECK(g.state == GraphObj::State::Capturing, CaptureError,
                 "graph_capture_end: no capture into this graph is underway; call "
                 "graph_capture_begin first");
  std::exception_ptr driver_error;
  std::string invalidated;
  DriverGraph dg = finish_capture(rt, g, driver_error, invalidated);
  if (driver_error || !invalidated.empty()) {
    g.dg = dg;
    release_graph(rt, g);
    if (!invalidated.empty()) {
      throw CaptureError(
          ErrorCode::CaptureInvalidated,
          detail::concat("graph_capture_end: the capture was invalidated by ", invalidated,
                         ". The stream has left capture mode and can be used "
                         "again; capture again without that call."),
          __FILE__, __LINE__);
    }
    std::rethrow_exception(driver_error);
  }
  g.dg = dg;
  g.nodes = rt.driver->graph_node_count(dg);
  g.state = GraphObj::State::Captured;
}

namespace {
void check_replayable(GraphObj& g, const char* call) {
  ACCEL_RT_CHECK(g.state != GraphObj::State::Capturing, CaptureError, call,
                 ": the capture into this graph is still underway; call graph_capture_end "
                 "first");
  ACCEL_RT_CHECK(g.state == GraphObj::State::Captured, InvalidValueError, call,
                 ": the graph is empty; capture work into it first");
}
}  // namespace

void graph_instantiate(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_instantiate");
  std::lock_guard<std::mutex> lock(g.m);
  check_replayable(g, "graph_instantiate");
  if (g.exec == nullptr) g.exec = rt.driver->graph_instantiate(g.dg);
}

void graph_replay(Graph graph, Stream stream) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_replay");
  StreamObj& s = rt.stream(stream, "graph_replay");
  std::lock_guard<std::mutex> lock(g.m);
  check_replayable(g, "graph_replay");
  ACCEL_RT_CHECK(s.device == g.device, InvalidValueError,
                 "graph_replay: the graph was captured "
                 "on device ",
                 g.device, " but ", detail::describe(stream), " is on device ", s.device);
  if (g.exec == nullptr) g.exec = rt.driver->graph_instantiate(g.dg);
  rt.driver->graph_launch(g.exec, s.ds);
}

void graph_replay(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_replay");
  int device;
  {
    std::lock_guard<std::mutex> lock(g.m);
    check_replayable(g, "graph_replay");
    device = g.device;
  }
  graph_replay(graph, rt.current_stream_obj(device).handle());
}

void graph_reset(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_reset");
  std::lock_guard<std::mutex> lock(g.m);
  reset_locked(rt, g);
}

PoolId graph_pool(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_pool");
  std::lock_guard<std::mutex> lock(g.m);
  return g.holds_pool ? g.pool : PoolId{};
}

std::size_t graph_node_count(Graph graph) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_node_count");
  std::lock_guard<std::mutex> lock(g.m);
  return g.nodes;
}

void graph_debug_dump(Graph graph, const std::string& path) {
  Runtime& rt = Runtime::get();
  GraphObj& g = rt.graph(graph, "graph_debug_dump");
  std::lock_guard<std::mutex> lock(g.m);
  check_replayable(g, "graph_debug_dump");
  rt.driver->graph_debug_dump(g.dg, path.c_str());
}

CaptureStatus stream_capture_status(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_capture_status");
  if (!s.capturing.load(std::memory_order_acquire)) return CaptureStatus::None;
  std::lock_guard<std::mutex> lock(rt.capture_mutex);
  if (s.capture == nullptr) return CaptureStatus::None;
  return s.capture->invalidated.empty() ? CaptureStatus::Active : CaptureStatus::Invalidated;
}

uint64_t stream_capture_id(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_capture_id");
  if (!s.capturing.load(std::memory_order_acquire)) return 0;
  std::lock_guard<std::mutex> lock(rt.capture_mutex);
  return s.capture != nullptr ? s.capture->id : 0;
}

void capture_refuse(Stream stream, const std::string& what, const std::string& why) {
  Runtime& rt = Runtime::get();
  rt.refuse_capture(rt.stream(stream, "capture_refuse"), what, why);
}

void capture_keep_memory(Stream stream, const void* ptr) {
  Runtime& rt = Runtime::get();
  rt.keep_for_capture(rt.stream(stream, "capture_keep_memory"), ptr);
}

bool device_is_capturing(int device) {
  Runtime& rt = Runtime::get();
  return rt.devices[rt.resolve_device(device, "device_is_capturing")]->captures.load() > 0;
}

}  // namespace accel::rt
