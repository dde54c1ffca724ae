// The host driver's streams, events and captures (private to the host driver).
//
//  - Streams: submission appends to the queue under the stream's mutex and wakes the worker
//    only when it sleeps; the worker spins briefly before sleeping so back-to-back submissions
//    do not pay a wake-up each. ACCEL_LAUNCH_BLOCKING runs every task on the caller's thread.
//  - Events: a record enqueues a marker that stamps the time and bumps the completed count;
//    a wait enqueues a task that blocks the waiting stream's worker until that count is reached.
//  - Capture: work submitted to a capturing stream becomes a node of a DAG whose edges follow
//    stream order and event record/wait (host_graph.cpp replays it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/driver.h"
#include "runtime/drivers/host/busy_clock.h"
#include "runtime/drivers/host/ipc_events.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ACCEL_CPU_RELAX() _mm_pause()
#else
#define ACCEL_CPU_RELAX() std::this_thread::yield()
#endif

namespace accel::rt::host {

// How long a worker polls for new work before it sleeps, and how long a synchronizing thread
// polls for completion before it sleeps: short enough to cost little CPU, long enough that
// back-to-back submissions and quick round trips skip the futex wake-up. The worker's wait
// covers the Python between the launches of a compiled function (Dynamo's guards and
// AOTAutograd's wrappers, about 30 us): with 20 us the worker slept between the two kernels of a
// compiled bias+GELU+residual+layer norm, and one synchronized call on 8x1024 floats took 57 to
// 74 us against 26 us now (2-core VM; a wake-up there costs tens of microseconds).
inline constexpr std::chrono::nanoseconds kWorkerSpin{200000};
// A worker idle this long gives back the OpenMP team its tasks' kernels made (see work()).
inline constexpr std::chrono::milliseconds kWorkerKeepsTeam{100};
inline constexpr std::chrono::nanoseconds kSyncSpin{10000};

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

class HostDriver;
struct HostStream;

// One recorded piece of work and the nodes it depends on.
struct Node {
  Task task;
  std::vector<uint32_t> deps;
  std::string label;  // what it does, for debug dumps
};

// A capture in progress, shared by every stream that joined it.
struct Capture {
  std::mutex m;
  int device = 0;
  CaptureMode mode = CaptureMode::Global;
  std::thread::id thread;  // the thread that began it
  HostStream* origin = nullptr;
  std::vector<Node> nodes;
  std::vector<std::shared_ptr<HostStream>> joined;  // origin first
  bool ended = false;

  uint32_t add_node(Task task, std::vector<uint32_t> deps, const char* label);
};

struct HostStream;

struct HostEvent {
  int device = 0;
  bool timing = false;
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0;  // records issued
  uint64_t done = 0;      // highest record completed
  std::chrono::steady_clock::time_point stamp{};
  // The stream of the latest record and that record's task number there. The task completes
  // the event just before the stream counts it done; event_query and event_synchronize, once the
  // record completed, wait for that count, so that the stream is idle afterwards when the event
  // was its last work, as CUDA's. Empty for records of another process (interprocess events).
  std::weak_ptr<HostStream> record_stream;
  uint64_t record_task = 0;
  // Whether the latest record's stream counted its task done (under m).
  bool stream_passed() const;
  // Set when last recorded on a capturing stream.
  std::weak_ptr<Capture> capture;
  std::vector<uint32_t> capture_frontier;
  // An interprocess event: its counts live there instead (ipc_events.h).
  std::shared_ptr<SharedEventSlot> shared;
  IpcEventHandle ipc_handle;  // of the shared one

  // Under m: a new record's version, the latest record's, the highest completed.
  uint64_t issue_record() { return shared ? shared->issue_record() : ++recorded; }
  uint64_t last_record() const { return shared ? shared->last_record() : recorded; }
  uint64_t completed() const { return shared ? shared->completed() : done; }
  void complete(uint64_t version);
  void wait_for(uint64_t version);
};
struct EventRef {
  std::shared_ptr<HostEvent> ev;
};

// Interprocess events (ipc_events.cpp): a new one of `device`, its handle, and an event of this
// process opened from another's handle.
std::shared_ptr<HostEvent> create_ipc_event(int device);
IpcEventHandle ipc_event_handle(const HostEvent& event);
std::shared_ptr<HostEvent> open_ipc_event(int device, const IpcEventHandle& handle);

// The stream whose worker (or graph branch helper) is running the current task, if any.
extern thread_local HostStream* tls_worker_stream;

// ACCEL_PROTECT_DEVICE_MEMORY: whether the driver protects device memory, and access to all of
// it for a stream worker's batch of tasks (defined with HostDriver).
bool protects_memory(const HostDriver* driver);
void access_all_memory(HostDriver* driver, bool begin);

struct HostStream : std::enable_shared_from_this<HostStream> {
  HostDriver* driver = nullptr;
  int device = 0;
  int priority = 0;
  bool blocking = false;
  BusyClock* busy = nullptr;  // the device's, told when tasks run (may be null)

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
  void shutdown();

  // Returns true if the task was recorded into a capture (caller holds m).
  bool record_if_capturing(Task& task, const char* label);
  void submit(Task task, const char* label);
  // Records, runs inline or queues `task`; `lock` holds m and is released. Callers that
  // decided something under m (an event version) enqueue without letting go of it in between.
  void enqueue_locked(Task task, const char* label, std::unique_lock<std::mutex>& lock);

  void record_error(const char* what);
  bool idle() const {
    return completed.load(std::memory_order_acquire) == submitted.load(std::memory_order_acquire);
  }
  void synchronize();
  void throw_if_failed();

 private:
  void run_inline(Task& task);
  void mark_completed();
  void work();
  bool access(bool begin);
  void apply_priority();
  std::string take_error();
};

}  // namespace accel::rt::host
