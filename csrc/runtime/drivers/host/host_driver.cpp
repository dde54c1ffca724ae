// The embedded host driver: device memory is host memory owned by the runtime, and each
// stream is an ordered queue executed by its own worker thread (started on first use).
//
//  - Memory: mmap'd per device, with an enforced capacity so out-of-memory is real. Frees of
//    memory that queued work may still touch are deferred until every stream of the device has
//    passed the point of the free (what cudaFree's implicit synchronization gives on CUDA).
//  - Streams: submission appends to the queue under the stream's mutex and wakes the worker
//    only when it sleeps; the worker spins briefly before sleeping so back-to-back submissions
//    do not pay a wake-up each. ACCEL_LAUNCH_BLOCKING runs every task on the caller's thread.
//  - Events: a record enqueues a marker that stamps the time and bumps the completed count;
//    a wait enqueues a task that blocks the waiting stream's worker until that count is reached.
//  - Capture: work submitted to a capturing stream becomes a node of a DAG whose edges follow
//    stream order and event record/wait; replay executes the nodes in capture order, which is
//    a topological order of the DAG, as one task on the replay stream.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "runtime/driver.h"
#include "runtime/drivers/host/protect.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ACCEL_CPU_RELAX() _mm_pause()
#else
#define ACCEL_CPU_RELAX() std::this_thread::yield()
#endif

namespace accel::rt::host {
namespace {

constexpr std::size_t kPageSize = 4096;
// How long a worker polls for new work before it sleeps, and how long a synchronizing thread
// polls for completion before it sleeps: short enough to cost little CPU, long enough that
// back-to-back submissions and quick round trips skip the futex wake-up (several microseconds).
constexpr std::chrono::nanoseconds kWorkerSpin{20000};
constexpr std::chrono::nanoseconds kSyncSpin{10000};

// Polls `done` until it returns true or `budget` has passed; true if it became true.
template <class F>
bool spin_until(F&& done, std::chrono::nanoseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (done()) return true;
      ACCEL_CPU_RELAX();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
  }
}

std::size_t round_up(std::size_t n, std::size_t m) {
  return (n + m - 1) / m * m;
}

class HostDriver;
struct HostStream;

struct Node {
  Task task;
  std::vector<uint32_t> deps;
};

// A capture in progress, shared by every stream that joined it.
struct Capture {
  std::mutex m;
  int device = 0;
  HostStream* origin = nullptr;
  std::vector<Node> nodes;
  std::vector<std::shared_ptr<HostStream>> joined;  // origin first
  bool ended = false;

  uint32_t add_node(Task task, std::vector<uint32_t> deps) {
    std::lock_guard<std::mutex> lock(m);
    ACCEL_RT_CHECK(!ended, CaptureError, "host driver: the capture already ended");
    nodes.push_back(Node{std::move(task), std::move(deps)});
    return static_cast<uint32_t>(nodes.size() - 1);
  }
};

struct HostEvent {
  int device = 0;
  bool timing = false;
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records issued
  uint64_t done = 0;      // highest record completed
  std::chrono::steady_clock::time_point stamp{};
  // Set when last recorded on a capturing stream.
  std::weak_ptr<Capture> capture;
  std::vector<uint32_t> capture_frontier;

  void complete(uint64_t version) {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard<std::mutex> lock(m);
      if (version > done) {
        done = version;
        stamp = now;
      }
    }
    cv.notify_all();
  }
  void wait_for(uint64_t version) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done >= version; });
  }
};
struct EventRef {
  std::shared_ptr<HostEvent> ev;
};

struct Exec {
  std::shared_ptr<std::vector<Node>> nodes;
  // Launches of one executable graph never overlap (as with cudaGraphLaunch): each launch
  // runs all nodes under this lock. Launches from one stream keep that stream's order.
  std::mutex run_mutex;

  void run() {
    std::lock_guard<std::mutex> lock(run_mutex);
    // Nodes were recorded in an order consistent with their dependencies.
    for (Node& n : *nodes) n.task();
  }
};
struct ExecRef {
  std::shared_ptr<Exec> exec;
};
struct HostGraph {
  int device = 0;
  std::shared_ptr<std::vector<Node>> nodes;
};

thread_local HostStream* tls_worker_stream = nullptr;

// ACCEL_PROTECT_DEVICE_MEMORY: whether the driver protects device memory, and access to all of
// it for a stream worker's batch of tasks (defined after HostDriver).
bool protects_memory(const HostDriver* driver);
void access_all_memory(HostDriver* driver, bool begin);

struct HostStream {
  HostDriver* driver = nullptr;
  int device = 0;
  int priority = 0;
  bool blocking = false;

  std::mutex m;
  std::condition_variable cv_work;
  std::condition_variable cv_done;
  std::vector<Task> queue;
  bool sleeping = false;
  bool stop = false;
  std::thread worker;
  std::atomic<uint64_t> submitted{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<int> waiters{0};
  std::string error;  // first failure of a task since the last synchronize

  // Capture state (under m).
  std::shared_ptr<Capture> capture;
  std::vector<uint32_t> frontier;

  // Serializes inline execution in launch-blocking mode; recursive so that a task enqueuing
  // more work on its own stream runs it at once instead of deadlocking.
  std::recursive_mutex inline_mutex;

  ~HostStream() { shutdown(); }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv_work.notify_all();
    if (worker.joinable()) worker.join();
  }

  // Returns true if the task was recorded into a capture (caller holds m).
  bool record_if_capturing(Task& task) {
    if (!capture) return false;
    const uint32_t id = capture->add_node(std::move(task), frontier);
    frontier.assign(1, id);
    return true;
  }

  void submit(Task task) {
    std::unique_lock<std::mutex> lock(m);
    enqueue_locked(std::move(task), lock);
  }

  // Records, runs inline or queues `task`; `lock` holds m and is released. Callers that
  // decided something under m (an event version) enqueue without letting go of it in between.
  void enqueue_locked(Task task, std::unique_lock<std::mutex>& lock) {
    if (record_if_capturing(task)) return;
    if (blocking) {
      lock.unlock();
      run_inline(task);
      return;
    }
    queue.push_back(std::move(task));
    submitted.fetch_add(1, std::memory_order_seq_cst);
    if (!worker.joinable()) {
      worker = std::thread([this] { work(); });
    }
    const bool wake = sleeping;
    lock.unlock();
    if (wake) cv_work.notify_one();
  }

  void run_inline(Task& task) {
    std::lock_guard<std::recursive_mutex> lock(inline_mutex);
    submitted.fetch_add(1, std::memory_order_seq_cst);
    struct Done {
      HostStream* s;
      ~Done() { s->mark_completed(); }
    } done{this};
    task();  // launch blocking: a failure surfaces at the call that submitted the work
  }

  void mark_completed() {
    completed.fetch_add(1, std::memory_order_seq_cst);
    if (waiters.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(m);
      cv_done.notify_all();
    }
  }

  void work() {
    tls_worker_stream = this;
    apply_priority();
    std::vector<Task> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m);
        while (queue.empty() && !stop) {
          lock.unlock();
          spin_until(
              [&] {
                return submitted.load(std::memory_order_relaxed) !=
                       completed.load(std::memory_order_relaxed);
              },
              kWorkerSpin);
          lock.lock();
          if (!queue.empty() || stop) break;
          sleeping = true;
          cv_work.wait(lock);
          sleeping = false;
        }
        if (queue.empty() && stop) return;
        batch.swap(queue);
      }
      // With protected memory, every task unprotects all device memory while it runs; a batch
      // holds that access throughout, so tasks inside it pay no mprotect of their own. It ends
      // before the last task counts as completed: a synchronize that returns finds the memory
      // protected again.
      const bool lease = protects_memory(driver) && access(true);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        try {
          batch[i]();
        } catch (const std::exception& e) {
          record_error(e.what());
        } catch (...) {
          record_error("unknown exception");
        }
        batch[i].reset();
        if (lease && i + 1 == batch.size()) access(false);
        mark_completed();
      }
      batch.clear();
    }
  }

  // Begins or ends the batch's access to all device memory; false if that failed (each task
  // then still gets its own access).
  bool access(bool begin) {
    try {
      access_all_memory(driver, begin);
      return true;
    } catch (const std::exception& e) {
      record_error(e.what());
      return false;
    }
  }

  void apply_priority() {
    // Best effort: higher-priority streams get a lower nice value where permitted.
    if (priority < 0) {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), priority * 5);
    }
    // Linux limits thread names to 15 characters.
    std::string name = "accel-d" + std::to_string(device) + "-p" + std::to_string(-priority);
    name.resize(std::min<std::size_t>(name.size(), 15));
    ::pthread_setname_np(::pthread_self(), name.c_str());
  }

  void record_error(const char* what) {
    std::lock_guard<std::mutex> lock(m);
    if (error.empty()) error = what;
  }

  std::string take_error() {
    std::lock_guard<std::mutex> lock(m);
    std::string e;
    e.swap(error);
    return e;
  }

  bool idle() const {
    return completed.load(std::memory_order_acquire) == submitted.load(std::memory_order_acquire);
  }

  void synchronize() {
    ACCEL_RT_CHECK(tls_worker_stream != this, InvalidValueError,
                   "stream_synchronize was called from a task running on the same stream; "
                   "it would wait for itself forever");
    const uint64_t target = submitted.load(std::memory_order_seq_cst);
    const auto reached = [&] { return completed.load(std::memory_order_seq_cst) >= target; };
    if (!spin_until(reached, kSyncSpin)) {
      std::unique_lock<std::mutex> lock(m);
      waiters.fetch_add(1, std::memory_order_seq_cst);
      cv_done.wait(lock, reached);
      waiters.fetch_sub(1, std::memory_order_seq_cst);
    }
    throw_if_failed();
  }

  void throw_if_failed() {
    std::string e = take_error();
    if (!e.empty()) {
      ACCEL_RT_THROW(TaskError, "a task on a stream of device ", device, " failed: ", e);
    }
  }
};

// A point in the execution of every stream of a device.
struct Marker {
  std::vector<std::pair<std::shared_ptr<HostStream>, uint64_t>> positions;
  bool passed() const {
    for (const auto& [s, n] : positions) {
      if (s->completed.load(std::memory_order_acquire) < n) return false;
    }
    return true;
  }
};

struct HostDevice {
  uint64_t capacity = 0;
  std::atomic<uint64_t> used{0};  // mapped bytes, including frees not yet reclaimed
  DeviceMemory memory;
  std::mutex m;  // streams and deferred
  std::vector<std::shared_ptr<HostStream>> streams;
  struct Deferred {
    void* ptr;
    std::size_t size;
    Marker marker;
  };
  std::vector<Deferred> deferred;

  HostDevice(uint64_t cap, bool protect) : capacity(cap), memory(protect) {}

  Marker marker_locked() {
    Marker mk;
    for (auto& s : streams) {
      const uint64_t n = s->submitted.load(std::memory_order_acquire);
      if (s->completed.load(std::memory_order_acquire) < n) mk.positions.emplace_back(s, n);
    }
    return mk;
  }

  void reclaim() {
    std::vector<Deferred> ready;
    {
      std::lock_guard<std::mutex> lock(m);
      if (deferred.empty()) return;
      auto it = std::partition(deferred.begin(), deferred.end(),
                               [](const Deferred& d) { return !d.marker.passed(); });
      std::move(it, deferred.end(), std::back_inserter(ready));
      deferred.erase(it, deferred.end());
    }
    for (auto& d : ready) {
      memory.unmap(d.ptr, d.size);
      used.fetch_sub(d.size);
    }
  }
};

HostStream* as_stream(DriverStream s) {
  return reinterpret_cast<HostStream*>(s);
}
HostEvent* as_event(DriverEvent e) {
  return reinterpret_cast<EventRef*>(e)->ev.get();
}

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
          std::make_unique<HostDevice>(o.memory_per_device, o.protect_device_memory));
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
    return p;
  }

  void set_device(int) override {}

  MemoryInfo mem_get_info(int device) override {
    HostDevice& d = *devices_[device];
    d.reclaim();
    const uint64_t used = d.used.load();
    return MemoryInfo{used >= d.capacity ? 0 : d.capacity - used, d.capacity};
  }

  bool host_accessible_memory() const override { return true; }

  void* raw_alloc(int device, std::size_t size) override {
    HostDevice& d = *devices_[device];
    d.reclaim();
    const std::size_t bytes = round_up(size, kPageSize);
    uint64_t used = d.used.load();
    do {
      if (bytes > d.capacity || used > d.capacity - bytes) return nullptr;
    } while (!d.used.compare_exchange_weak(used, used + bytes));
    void* p = d.memory.map(bytes);
    if (p == nullptr) d.used.fetch_sub(bytes);
    return p;
  }

  void raw_free(int device, void* ptr, std::size_t size) override {
    HostDevice& d = *devices_[device];
    const std::size_t bytes = round_up(size, kPageSize);
    {
      std::lock_guard<std::mutex> lock(d.m);
      Marker mk = d.marker_locked();
      if (!mk.positions.empty()) {
        d.deferred.push_back(HostDevice::Deferred{ptr, bytes, std::move(mk)});
        return;
      }
    }
    d.memory.unmap(ptr, bytes);
    d.used.fetch_sub(bytes);
  }

  void* host_alloc(std::size_t size) override {
    return std::aligned_alloc(kPageSize, round_up(size, kPageSize));
  }
  void host_free(void* ptr, std::size_t) override { std::free(ptr); }

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
    std::lock_guard<std::mutex> lock(d.m);
    d.streams.push_back(s);
    return reinterpret_cast<DriverStream>(s.get());
  }

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

  void launch_host_func(DriverStream stream, Task task) override {
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
    s->submit(std::move(task));
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
      Access a(dst_mem, dst, size);
      Access b(src_mem, src, size);
      std::memcpy(dst, src, size);
    }));
  }

  void memset_async(void* dst, int value, std::size_t size, DriverStream stream) override {
    HostStream* s = as_stream(stream);
    DeviceMemory* mem = memory_of(dst);
    s->submit(Task([=] {
      Access a(mem, dst, size);
      std::memset(dst, value, size);
    }));
  }

  bool stream_query(DriverStream stream) override {
    HostStream* s = as_stream(stream);
    const bool idle = s->idle();
    if (idle) s->throw_if_failed();
    return idle;
  }

  void stream_synchronize(DriverStream stream) override { as_stream(stream)->synchronize(); }

  // Events ----------------------------------------------------------------------------
  DriverEvent event_create(int device, bool timing) override {
    auto* ref = new EventRef{std::make_shared<HostEvent>()};
    ref->ev->device = device;
    ref->ev->timing = timing;
    return reinterpret_cast<DriverEvent>(ref);
  }

  void event_destroy(DriverEvent event) override { delete reinterpret_cast<EventRef*>(event); }

  void event_record(DriverEvent event, DriverStream stream) override {
    std::shared_ptr<HostEvent> ev = reinterpret_cast<EventRef*>(event)->ev;
    HostStream* s = as_stream(stream);
    std::unique_lock<std::mutex> slock(s->m);
    if (s->capture) {
      std::lock_guard<std::mutex> elock(ev->m);
      ev->capture = s->capture;
      ev->capture_frontier = s->frontier;
      return;
    }
    uint64_t version;
    {
      std::lock_guard<std::mutex> elock(ev->m);
      version = ++ev->recorded;
      ev->capture.reset();
      ev->capture_frontier.clear();
    }
    s->enqueue_locked(Task([ev = std::move(ev), version] { ev->complete(version); }), slock);
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
      version = ev->recorded;
      done = ev->done >= ev->recorded;
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
    s->enqueue_locked(Task([ev = std::move(ev), version] { ev->wait_for(version); }), slock);
  }

  bool event_query(DriverEvent event) override {
    HostEvent* ev = as_event(event);
    std::lock_guard<std::mutex> lock(ev->m);
    return ev->done >= ev->recorded;
  }

  void event_synchronize(DriverEvent event) override {
    HostEvent* ev = as_event(event);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(ev->m);
      version = ev->recorded;
    }
    ev->wait_for(version);
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
  void stream_begin_capture(DriverStream stream, CaptureMode) override {
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
    cap->origin = s;
    cap->joined.push_back(std::move(self));
    s->capture = std::move(cap);
    s->frontier.clear();
  }

  DriverGraph stream_end_capture(DriverStream stream) override {
    HostStream* origin = as_stream(stream);
    std::shared_ptr<Capture> cap;
    std::vector<uint32_t> origin_frontier;
    {
      std::lock_guard<std::mutex> lock(origin->m);
      cap = origin->capture;
      ACCEL_RT_CHECK(cap && cap->origin == origin, CaptureError,
                     "the stream is not the origin of a capture");
      origin_frontier = origin->frontier;
    }
    std::vector<std::shared_ptr<HostStream>> joined;
    std::vector<Node> nodes;
    {
      std::lock_guard<std::mutex> lock(cap->m);
      cap->ended = true;
      joined = cap->joined;
      nodes = std::move(cap->nodes);
    }
    // Everything reachable backwards from the origin's last work.
    std::vector<char> reached(nodes.size(), 0);
    std::vector<uint32_t> todo(origin_frontier);
    while (!todo.empty()) {
      const uint32_t n = todo.back();
      todo.pop_back();
      if (reached[n]) continue;
      reached[n] = 1;
      for (uint32_t dep : nodes[n].deps) todo.push_back(dep);
    }
    int unjoined = 0;
    for (auto& s : joined) {
      std::lock_guard<std::mutex> lock(s->m);
      if (s.get() != origin) {
        for (uint32_t n : s->frontier) {
          if (!reached[n]) {
            ++unjoined;
            break;
          }
        }
      }
      s->capture.reset();
      s->frontier.clear();
    }
    if (unjoined > 0) {
      throw CaptureError(ErrorCode::CaptureUnjoined,
                         detail::concat(unjoined,
                                        " stream(s) joined the capture but their work was not "
                                        "joined back into the origin stream before "
                                        "capture_end; record an event on each of them and "
                                        "make the origin stream wait on it"),
                         __FILE__, __LINE__);
    }
    auto* g = new HostGraph{cap->device, std::make_shared<std::vector<Node>>(std::move(nodes))};
    return reinterpret_cast<DriverGraph>(g);
  }

  std::size_t graph_node_count(DriverGraph graph) override {
    return reinterpret_cast<HostGraph*>(graph)->nodes->size();
  }

  DriverGraphExec graph_instantiate(DriverGraph graph) override {
    auto* ref = new ExecRef{std::make_shared<Exec>()};
    ref->exec->nodes = reinterpret_cast<HostGraph*>(graph)->nodes;
    return reinterpret_cast<DriverGraphExec>(ref);
  }

  void graph_launch(DriverGraphExec exec, DriverStream stream) override {
    std::shared_ptr<Exec> e = reinterpret_cast<ExecRef*>(exec)->exec;
    as_stream(stream)->submit(Task([e = std::move(e)] { e->run(); }));
  }

  void graph_destroy(DriverGraph graph) override { delete reinterpret_cast<HostGraph*>(graph); }
  void graph_exec_destroy(DriverGraphExec exec) override {
    delete reinterpret_cast<ExecRef*>(exec);
  }

 private:
  // Scoped runtime access to device memory for a copy (no-op unless protecting).
  struct Access {
    DeviceMemory* mem;
    const void* p;
    std::size_t n;
    Access(DeviceMemory* m, const void* ptr, std::size_t size) : mem(m), p(ptr), n(size) {
      if (mem) mem->acquire(p, n);
    }
    ~Access() {
      if (mem) mem->release(p, n);
    }
  };

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

}  // namespace
}  // namespace accel::rt::host

namespace accel::rt {
Driver::~Driver() = default;
void Driver::host_access_begin(int, const void*, std::size_t) {}
void Driver::host_access_end(int, const void*, std::size_t) {}

std::unique_ptr<Driver> make_host_driver(const HostDriverOptions& options) {
  return std::make_unique<host::HostDriver>(options);
}
}  // namespace accel::rt
