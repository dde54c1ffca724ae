// The embedded host driver: device memory is host memory owned by the runtime, and each
// stream is an ordered queue executed by its own worker thread (started on first use;
// host_stream.cpp). Graphs are DAGs of recorded tasks (host_graph.cpp).
//
//  - Memory: mmap'd per device, with an enforced capacity so out-of-memory is real. Frees of
//    memory that queued work may still touch are deferred until every stream of the device has
//    passed the point of the free (what cudaFree's implicit synchronization gives on CUDA).
//  - Capture rules: the calls CUDA refuses while a capture is underway (allocating and freeing
//    device memory, querying or waiting for streams and events) throw CaptureError here too,
//    under the same rules (the capture's mode, the calling thread's mode), so that the layer
//    above is tested against them without a GPU.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "runtime/driver.h"
#include "runtime/drivers/host/capture_rules.h"
#include "runtime/drivers/host/host_device.h"
#include "runtime/drivers/host/host_graph.h"
#include "runtime/drivers/host/host_stream.h"
#include "runtime/drivers/host/protect.h"

namespace accel::rt::host {
namespace {

constexpr std::size_t kPageSize = 4096;
constexpr std::size_t kVaGranularity = std::size_t{2} << 20;

std::size_t round_up(std::size_t n, std::size_t m) {
  return (n + m - 1) / m * m;
}

HostStream* as_stream(DriverStream s) {
  return reinterpret_cast<HostStream*>(s);
}
HostEvent* as_event(DriverEvent e) {
  return reinterpret_cast<EventRef*>(e)->ev.get();
}

}  // namespace

class HostDriver final : public Driver {
 public:
  explicit HostDriver(const HostDriverOptions& o) : options_(o) {
    ACCEL_RT_CHECK(o.devices >= 1 && o.devices <= kMaxDevices, InitError,
                   "host driver: the device count must be between 1 and ", kMaxDevices, ", got ",
                   o.devices);
    ACCEL_RT_CHECK(o.memory_per_device >= kPageSize, InitError,
                   "host driver: memory per device must be at least ", kPageSize, " bytes");
    for (int i = 0; i < o.devices; ++i) {
      devices_.push_back(
          std::make_unique<HostDevice>(o.memory_per_device, o.protect_device_memory, i));
    }
  }

  ~HostDriver() override {
    for (auto& d : devices_) {
      std::vector<std::shared_ptr<HostStream>> streams;
      {
        std::lock_guard<std::mutex> lock(d->m);
        streams.swap(d->streams);
      }
      for (auto& s : streams) s->shutdown();
      for (auto& def : d->deferred) d->memory.unmap(def.ptr, def.size);
    }
  }

  std::string_view name() const override { return options_.name; }
  int device_count() override { return static_cast<int>(devices_.size()); }

  DeviceProperties device_properties(int device) override {
    DeviceProperties p;
    p.name = "accel host device " + std::to_string(device);
    p.driver = options_.name;
    p.total_memory = devices_[device]->capacity;
    p.compute_units = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p.major = 1;
    p.minor = 0;
    p.max_threads_per_compute_unit = 1;
    p.integrated = true;
    p.max_kernel_args = options_.max_kernel_args;
    p.max_kernel_buffers = options_.max_kernel_buffers;
    p.uuid = host_device_uuid(options_.name, device);
    return p;
  }

  void set_device(int) override {}

  MemoryInfo mem_get_info(int device) override {
    HostDevice& d = *devices_[device];
    d.reclaim();
    const uint64_t used = d.used.load();
    return MemoryInfo{used >= d.capacity ? 0 : d.capacity - used, d.capacity};
  }

  // Utilization: the share of the last second during which one of the device's streams ran a
  // task; memory used: what the driver has mapped for the device (a host device belongs to one
  // process). The rest has no meaning for threads over host memory.
  int64_t device_sensor(int device, Sensor sensor) override {
    HostDevice& d = *devices_[device];
    switch (sensor) {
      case Sensor::Utilization: return d.busy.percent();
      case Sensor::MemoryUsed: d.reclaim(); return static_cast<int64_t>(d.used.load());
      case Sensor::MemoryUtilization:
        ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                       " driver cannot tell when its device memory (host memory) is read or "
                       "written, so it reports no memory utilization");
      default:
        ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                       " driver's devices are worker threads over host memory, with no ",
                       sensor_name(sensor), " sensor of their own");
    }
  }
  std::vector<DeviceProcess> device_processes(int device) override {
    return {DeviceProcess{static_cast<int64_t>(::getpid()),
                          static_cast<uint64_t>(device_sensor(device, Sensor::MemoryUsed))}};
  }

  DriverCapabilities capabilities() const override { return options_.capabilities; }
  std::string oom_hint() const override {
    return "The host driver's device capacity is set by ACCEL_HOST_MEMORY.";
  }

  void* raw_alloc(int device, std::size_t size) override {
    check_capture_safe("raw_alloc");
    HostDevice& d = *devices_[device];
    d.reclaim();
    const std::size_t bytes = round_up(size, kPageSize);
    if (!d.take(bytes)) return nullptr;
    void* p = d.memory.map(bytes);
    if (p == nullptr) d.used.fetch_sub(bytes);
    return p;
  }

  void raw_free(int device, void* ptr, std::size_t size) override {
    check_capture_safe("raw_free");
    HostDevice& d = *devices_[device];
    d.give_back(ptr, round_up(size, kPageSize), HostDevice::Deferred::Kind::Unmap);
  }

  // Virtual memory: reservations of addresses, pages committed in 2 MiB units within the
  // capacity, decommitted and released once the streams passed (as raw_free).
  std::size_t va_granularity(int) override { return kVaGranularity; }
  void* va_reserve(int device, std::size_t size) override {
    check_capture_safe("va_reserve");
    return devices_[device]->memory.reserve(round_up(size, kVaGranularity));
  }
  void va_release(int device, void* ptr, std::size_t size) override {
    check_capture_safe("va_release");
    devices_[device]->give_back(ptr, round_up(size, kVaGranularity),
                                HostDevice::Deferred::Kind::Release);
  }
  bool va_map(int device, void* ptr, std::size_t size) override {
    check_capture_safe("va_map");
    HostDevice& d = *devices_[device];
    d.settle(ptr, size);  // an earlier va_unmap of these pages happens first
    if (!d.take(size)) return false;
    d.memory.commit(ptr, size);
    return true;
  }
  void va_unmap(int device, void* ptr, std::size_t size) override {
    check_capture_safe("va_unmap");
    devices_[device]->give_back(ptr, size, HostDevice::Deferred::Kind::Decommit);
  }

  // Interprocess memory: mappings of the device's memory file (shared_memory.cpp).
  IpcMemHandle ipc_get_mem_handle(int device, void* base, std::size_t size) override {
    return devices_[device]->memory.ipc_handle(base, size);
  }
  // Closes wait for the streams (as frees do); earlier ones that may go are closed first.
  void* ipc_open_mem_handle(int device, const IpcMemHandle& h, std::size_t* size) override {
    devices_[device]->reclaim();
    return devices_[device]->memory.open_shared(h, size);
  }
  void ipc_close_mem_handle(int device, void* ptr) override {
    devices_[device]->reclaim();
    devices_[device]->give_back(ptr, 0, HostDevice::Deferred::Kind::Close);
  }
  PointerAttributes pointer_attributes(const void* ptr) override {
    for (int d = 0; d < static_cast<int>(devices_.size()); ++d) {
      if (devices_[d]->memory.in_opened(ptr)) return {.type = MemoryType::Device, .device = d};
    }
    return {};
  }

  // Pinned memory is made and freed by calls CUDA counts as unsafe during a capture.
  void* host_alloc(std::size_t size) override {
    check_capture_safe("host_alloc");
    return std::aligned_alloc(kPageSize, round_up(size, kPageSize));
  }
  void host_free(void* ptr, std::size_t) override {
    check_capture_safe("host_free");
    std::free(ptr);
  }

  void host_access_begin(int device, const void* ptr, std::size_t size) override {
    devices_[device]->memory.acquire(ptr, size);
  }
  void host_access_end(int device, const void* ptr, std::size_t size) override {
    devices_[device]->memory.release(ptr, size);
  }

  // Streams ---------------------------------------------------------------------------
  std::pair<int, int> stream_priority_range() override { return {0, -2}; }

  DriverStream stream_create(int device, int priority) override {
    auto s = std::make_shared<HostStream>();
    s->driver = this;
    s->device = device;
    s->priority = priority;
    s->blocking = options_.launch_blocking;
    HostDevice& d = *devices_[device];
    s->busy = &d.busy;
    std::lock_guard<std::mutex> lock(d.m);
    d.streams.push_back(s);
    return reinterpret_cast<DriverStream>(s.get());
  }

  void* stream_native_handle(DriverStream stream) override { return as_stream(stream); }

  void stream_destroy(DriverStream stream) override {
    HostStream* s = as_stream(stream);
    s->synchronize();
    std::shared_ptr<HostStream> keep;
    HostDevice& d = *devices_[s->device];
    {
      std::lock_guard<std::mutex> lock(d.m);
      auto it = std::find_if(d.streams.begin(), d.streams.end(),
                             [&](const auto& p) { return p.get() == s; });
      if (it == d.streams.end()) return;
      keep = std::move(*it);
      d.streams.erase(it);
    }
    keep->shutdown();  // the worker exits; deferred-free markers may still hold the object
  }

  void launch_host_func(DriverStream stream, Task task, const char* label) override {
    HostStream* s = as_stream(stream);
    if (options_.protect_device_memory) {
      // The task's footprint is unknown: it may touch any device's memory (a copy between
      // devices runs on one device's stream and reads the other's memory).
      task = Task([t = std::move(task), this]() mutable {
        for (auto& d : devices_) d->memory.acquire_all();
        struct Release {
          HostDriver* driver;
          ~Release() {
            for (auto& d : driver->devices_) d->memory.release_all();
          }
        } release{this};
        t();
      });
    }
    s->submit(std::move(task), label);
  }

  void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind,
                    DriverStream stream) override {
    HostStream* s = as_stream(stream);
    DeviceMemory* dst_mem = kind == CopyKind::HostToDevice || kind == CopyKind::DeviceToDevice
                                ? memory_of(dst)
                                : nullptr;
    DeviceMemory* src_mem = kind == CopyKind::DeviceToHost || kind == CopyKind::DeviceToDevice
                                ? memory_of(src)
                                : nullptr;
    s->submit(Task([=] {
                ScopedAccess a(dst_mem, dst, size);
                ScopedAccess b(src_mem, src, size);
                std::memcpy(dst, src, size);
              }),
              copy_label(kind));
  }

  void memset_async(void* dst, int value, std::size_t size, DriverStream stream) override {
    HostStream* s = as_stream(stream);
    DeviceMemory* mem = memory_of(dst);
    s->submit(Task([=] {
                ScopedAccess a(mem, dst, size);
                std::memset(dst, value, size);
              }),
              "memset");
  }

  bool stream_query(DriverStream stream) override {
    check_capture_safe("stream_query");
    HostStream* s = as_stream(stream);
    const bool idle = s->idle();
    if (idle) s->throw_if_failed();
    return idle;
  }

  void stream_synchronize(DriverStream stream) override {
    check_capture_safe("stream_synchronize");
    HostStream* s = as_stream(stream);
    s->synchronize();
    // Memory freed while this stream had work queued goes back now that the work is done
    // (else at the next allocation): with the cache off (ACCEL_NO_MEMORY_CACHING) a kernel that
    // reads a freed tensor after a synchronize then faults, whichever thread runs it.
    devices_[s->device]->reclaim();
  }

  // Events ----------------------------------------------------------------------------
  DriverEvent event_create(int device, bool timing) override {
    auto* ref = new EventRef{std::make_shared<HostEvent>()};
    ref->ev->device = device;
    ref->ev->timing = timing;
    return reinterpret_cast<DriverEvent>(ref);
  }

  void event_destroy(DriverEvent event) override { delete reinterpret_cast<EventRef*>(event); }

  // Interprocess events: the counts in a shared memory file (ipc_events.cpp).
  DriverEvent event_create_ipc(int device) override {
    return reinterpret_cast<DriverEvent>(new EventRef{create_ipc_event(device)});
  }
  IpcEventHandle ipc_get_event_handle(DriverEvent event) override {
    return ipc_event_handle(*as_event(event));
  }
  DriverEvent ipc_open_event_handle(int device, const IpcEventHandle& handle) override {
    return reinterpret_cast<DriverEvent>(new EventRef{open_ipc_event(device, handle)});
  }

  void event_record(DriverEvent event, DriverStream stream) override {
    std::shared_ptr<HostEvent> ev = reinterpret_cast<EventRef*>(event)->ev;
    HostStream* s = as_stream(stream);
    std::unique_lock<std::mutex> slock(s->m);
    if (s->capture) {
      ACCEL_RT_CHECK(!ev->shared, CaptureError,
                     "event_record: an interprocess event cannot be recorded in a graph capture");
      std::lock_guard<std::mutex> elock(ev->m);
      ev->capture = s->capture;
      ev->capture_frontier = s->frontier;
      return;
    }
    uint64_t version;
    {
      std::lock_guard<std::mutex> elock(ev->m);
      version = ev->issue_record();
      ev->capture.reset();
      ev->capture_frontier.clear();
      // (the task enqueued below is the stream's next one)
      ev->record_stream = s->weak_from_this();
      ev->record_task = s->submitted.load(std::memory_order_seq_cst) + 1;
    }
    s->enqueue_locked(Task([ev = std::move(ev), version] { ev->complete(version); }), nullptr,
                      slock);
  }

  void stream_wait_event(DriverStream stream, DriverEvent event) override {
    std::shared_ptr<HostEvent> ev = reinterpret_cast<EventRef*>(event)->ev;
    HostStream* s = as_stream(stream);
    std::shared_ptr<Capture> cap;
    std::vector<uint32_t> cap_frontier;
    uint64_t version;
    bool done;
    {
      std::lock_guard<std::mutex> elock(ev->m);
      cap = ev->capture.lock();
      cap_frontier = ev->capture_frontier;
      version = ev->last_record();
      done = ev->completed() >= version;
    }
    std::unique_lock<std::mutex> slock(s->m);
    if (cap) {
      bool ended;
      {
        std::lock_guard<std::mutex> clock(cap->m);
        ended = cap->ended;
      }
      if (!ended) {
        join_capture(*s, cap, cap_frontier);
        return;
      }
    }
    if (s->capture) {
      // A dependency on work outside the capture cannot be part of the graph. If that work
      // already finished the dependency is empty and the wait is dropped.
      ACCEL_RT_CHECK(done, CaptureError,
                     "stream_wait_event: the event was recorded outside the capture and has not "
                     "completed; a captured stream cannot wait on eager work (wait before "
                     "capture_begin instead)");
      return;
    }
    if (done || version == 0) return;
    s->enqueue_locked(Task([ev = std::move(ev), version] { ev->wait_for(version); }), nullptr,
                      slock);
  }

  bool event_query(DriverEvent event) override {
    check_capture_safe("event_query");
    HostEvent* ev = as_event(event);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(ev->m);
      version = ev->last_record();
      if (ev->completed() < version) return false;
    }
    wait_stream_passed(ev, version);  // (a stream that waited on the event may be past it)
    return true;
  }

  void event_synchronize(DriverEvent event) override {
    check_capture_safe("event_synchronize");
    HostEvent* ev = as_event(event);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(ev->m);
      version = ev->last_record();
    }
    ev->wait_for(version);
    wait_stream_passed(ev, version);
  }

  // A completed record's stream counts its marker task done right after the task completed the
  // event: waits for that, so that the stream is idle afterwards if the event was its last work.
  static void wait_stream_passed(HostEvent* ev, uint64_t version) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(ev->m);
        if (ev->last_record() != version || ev->stream_passed()) return;
      }
      std::this_thread::yield();
    }
  }

  float event_elapsed_ms(DriverEvent start, DriverEvent end) override {
    HostEvent* a = as_event(start);
    HostEvent* b = as_event(end);
    std::chrono::steady_clock::time_point ta, tb;
    {
      std::lock_guard<std::mutex> lock(a->m);
      ta = a->stamp;
    }
    {
      std::lock_guard<std::mutex> lock(b->m);
      tb = b->stamp;
    }
    return std::chrono::duration<float, std::milli>(tb - ta).count();
  }

  // Graphs ----------------------------------------------------------------------------
  void stream_begin_capture(DriverStream stream, CaptureMode mode) override {
    HostStream* s = as_stream(stream);
    HostDevice& d = *devices_[s->device];
    std::shared_ptr<HostStream> self;
    {
      std::lock_guard<std::mutex> lock(d.m);
      for (auto& p : d.streams) {
        if (p.get() == s) self = p;
      }
    }
    ACCEL_RT_CHECK(self != nullptr, DriverError, "host driver: unknown stream");
    std::lock_guard<std::mutex> lock(s->m);
    ACCEL_RT_CHECK(!s->capture, CaptureError, "the stream is already capturing");
    auto cap = std::make_shared<Capture>();
    cap->device = s->device;
    cap->mode = mode;
    cap->thread = std::this_thread::get_id();
    cap->origin = s;
    captures_.add(cap);
    cap->joined.push_back(std::move(self));
    s->capture = std::move(cap);
    s->frontier.clear();
  }

  DriverGraph stream_end_capture(DriverStream stream) override {
    HostStream* origin = as_stream(stream);
    std::shared_ptr<Capture> cap;
    {
      std::lock_guard<std::mutex> lock(origin->m);
      cap = origin->capture;
    }
    struct Forget {  // the capture is over whether or not it gives a graph
      HostDriver* driver;
      std::shared_ptr<Capture> cap;
      ~Forget() {
        if (cap && cap->origin != nullptr) driver->captures_.forget(cap.get());
      }
    } forget{this, cap};
    if (cap && cap->origin != origin) forget.cap.reset();  // not this stream's capture
    return reinterpret_cast<DriverGraph>(end_capture(*origin));
  }

  std::size_t graph_node_count(DriverGraph graph) override {
    return reinterpret_cast<HostGraph*>(graph)->nodes->size();
  }

  DriverGraphExec graph_instantiate(DriverGraph graph) override {
    auto* ref = new ExecRef{std::make_shared<Exec>(reinterpret_cast<HostGraph*>(graph)->nodes)};
    return reinterpret_cast<DriverGraphExec>(ref);
  }

  void graph_launch(DriverGraphExec exec, DriverStream stream) override {
    std::shared_ptr<Exec> e = reinterpret_cast<ExecRef*>(exec)->exec;
    as_stream(stream)->submit(Task([e = std::move(e)] { e->run(); }), "graph launch");
  }

  void graph_debug_dump(DriverGraph graph, const char* path) override {
    write_dot(*reinterpret_cast<HostGraph*>(graph), path);
  }

  CaptureMode thread_capture_mode_exchange(CaptureMode mode) override {
    return CaptureRules::exchange_thread_mode(mode);
  }

  void graph_destroy(DriverGraph graph) override { delete reinterpret_cast<HostGraph*>(graph); }
  void graph_exec_destroy(DriverGraphExec exec) override {
    delete reinterpret_cast<ExecRef*>(exec);
  }

 private:
  struct ExecRef {
    std::shared_ptr<Exec> exec;
  };

  // CUDA's rule for "potentially unsafe" calls during capture (capture_rules.h).
  void check_capture_safe(const char* call) { captures_.check_safe(call); }

  static const char* copy_label(CopyKind kind) {
    switch (kind) {
      case CopyKind::HostToDevice: return "memcpy host to device";
      case CopyKind::DeviceToHost: return "memcpy device to host";
      case CopyKind::DeviceToDevice: return "memcpy device to device";
      default: return "memcpy host to host";
    }
  }

  // The device memory that maps ptr, when protection is on (nullptr otherwise: nothing to do).
  DeviceMemory* memory_of(const void* ptr) {
    if (!options_.protect_device_memory) return nullptr;
    for (auto& d : devices_) {
      if (d->memory.owns(ptr)) return &d->memory;
    }
    return nullptr;
  }

  void join_capture(HostStream& s, const std::shared_ptr<Capture>& cap,
                    const std::vector<uint32_t>& cap_frontier) {
    if (s.capture) {
      ACCEL_RT_CHECK(s.capture == cap, CaptureError,
                     "stream_wait_event: the stream is capturing a different graph than the one "
                     "the event was recorded in");
      for (uint32_t n : cap_frontier) {
        if (std::find(s.frontier.begin(), s.frontier.end(), n) == s.frontier.end()) {
          s.frontier.push_back(n);
        }
      }
      return;
    }
    ACCEL_RT_CHECK(s.device == cap->device, CaptureError, "stream_wait_event: a stream of device ",
                   s.device, " cannot join a capture on device ", cap->device);
    std::shared_ptr<HostStream> self;
    {
      HostDevice& d = *devices_[s.device];
      std::lock_guard<std::mutex> lock(d.m);
      for (auto& p : d.streams) {
        if (p.get() == &s) self = p;
      }
    }
    {
      std::lock_guard<std::mutex> lock(cap->m);
      cap->joined.push_back(std::move(self));
    }
    s.capture = cap;
    s.frontier = cap_frontier;
  }

  friend bool protects_memory(const HostDriver* driver);
  friend void access_all_memory(HostDriver* driver, bool begin);

  HostDriverOptions options_;
  std::vector<std::unique_ptr<HostDevice>> devices_;
  CaptureRules captures_;  // underway
};

bool protects_memory(const HostDriver* driver) {
  return driver->options_.protect_device_memory;
}

void access_all_memory(HostDriver* driver, bool begin) {
  for (auto& d : driver->devices_) {
    if (begin) {
      d->memory.acquire_all();
    } else {
      d->memory.release_all();
    }
  }
}

}  // namespace accel::rt::host

namespace accel::rt {
std::unique_ptr<Driver> make_host_driver(const HostDriverOptions& options) {
  return std::make_unique<host::HostDriver>(options);
}
}  // namespace accel::rt
