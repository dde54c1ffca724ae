// A CUDA runtime emulated on the host, for the cuda driver's conformance lane (README.md here).
// Declarations shared by the emulator's files; the API itself is CUDA's (cuda_runtime_api.h),
// defined with C linkage in runtime.cpp and graphs.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace cuda_emulator {

using Clock = std::chrono::steady_clock;

// A graph node: what it runs and the nodes it waits for (indices of earlier nodes, so the node
// list is in a topological order).
struct Node {
  std::function<void()> run;
  std::vector<std::size_t> deps;
  std::string label;
};
struct GraphData {
  std::vector<Node> nodes;
};
// Runs the nodes in dependency order; independent branches run concurrently (a host node of one
// branch may wait for another branch, as it may on a GPU).
void run_graph(const GraphData& g);

// How far a stream's work has run; shared with the events recorded on it, which may outlive it.
struct Progress {
  std::mutex m;
  std::condition_variable cv;
  uint64_t completed = 0;
  // Waits until the stream ran its seq-th operation; says on stderr when an API call has waited
  // for 20 s (a host function waiting for the thread that called?), then waits on.
  void wait(uint64_t seq, const char* call);
  bool reached(uint64_t seq);
};

// When an event's record ran.
struct Stamp {
  std::mutex m;
  uint64_t generation = 0;
  Clock::time_point time;
};

// A capture sequence: the origin stream, the streams that joined it, the graph so far.
struct Capture {
  unsigned long long id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  CUstream_st* origin = nullptr;
  std::thread::id thread;
  std::shared_ptr<GraphData> graph = std::make_shared<GraphData>();
  std::vector<CUstream_st*> joined;
  bool invalidated = false;
  bool ended = false;
};

// What the emulator keeps per thread (in a pthread key, not thread_local: LeakSanitizer misreads
// the dynamic TLS of a dlopen'ed library, and static TLS may not fit in a big process).
struct ThreadState {
  int device = 0;
  cudaError_t last = cudaSuccess;
  bool in_callback = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
};
ThreadState& thread_state();

// The emulated devices: how many, the memory of each, the calling thread's current one.
int device_count();
std::size_t device_memory();
int current_device();

// What [p, p + n) is: device memory (inside one allocation or contiguous mapped range: the
// bytes at `host`; else Bad), pinned host memory (inside one cudaHostAlloc), or pageable host
// memory. Under the global lock.
enum class Kind { Device, Pinned, Pageable, Bad };
struct Access {
  Kind kind = Kind::Pageable;
  char* host = nullptr;
  int device = -1;
};
Access classify(const void* p, std::size_t n);

// The emulator's global lock: captures, events' latest records, streams' capture state, memory.
std::mutex& global_mutex();
// Sets the calling thread's last error and returns e.
cudaError_t fail(cudaError_t e);
// cudaSuccess, or why no call may be made now (inside a host function, or in a forked child;
// cudaErrorIllegalAddress, sticky, once the context faulted: CUDA_EMULATOR_LOSE_DEVICE names a
// file, and the context dies when it exists, as at an illegal address in a kernel).
cudaError_t enter();
bool context_faulted();
// The stream a handle names (the legacy stream of the current device for 0); nullptr if none.
CUstream_st* resolve(cudaStream_t stream);
// Queues op on s, or adds it to the graph s is capturing into. *seq: its place in the queue.
cudaError_t submit(CUstream_st* s, std::function<void()> op, const char* label,
                   uint64_t* seq = nullptr);
// Queues op on s (eagerly: the caller checked that s is not capturing); returns its place in
// the queue. May be called under the global lock.
uint64_t enqueue(CUstream_st* s, std::function<void()> op);
// Under the global lock: adds a node to the capture s belongs to.
cudaError_t capture_node(CUstream_st* s, std::function<void()> op, const char* label);
// Under the global lock: marks the capture invalid (its end reports it).
void invalidate(Capture* c);
// A call CUDA calls potentially unsafe during capture (it may synchronize): refused, and the
// captures that forbid it invalidated, per CUDA's capture modes (the calling thread's mode and
// the modes the captures under way began with).
cudaError_t unsafe_call();

}  // namespace cuda_emulator

// The first line of every API call: returns its error when no call may be made now.
#define EMU_ENTER()                                                      \
  do {                                                                   \
    const cudaError_t entered_ = ::cuda_emulator::enter();               \
    if (entered_ != cudaSuccess) return ::cuda_emulator::fail(entered_); \
  } while (0)

struct CUstream_st {
  int device = 0;
  int priority = 0;
  unsigned flags = 0;
  std::shared_ptr<cuda_emulator::Progress> progress = std::make_shared<cuda_emulator::Progress>();
  std::mutex m;  // the queue
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue;
  uint64_t submitted = 0;
  bool stop = false;
  std::thread worker;
  // Under the global lock: the capture this stream belongs to, and the nodes its next node
  // depends on.
  cuda_emulator::Capture* capture = nullptr;
  std::vector<std::size_t> deps;
};

namespace cuda_emulator {
// An interprocess event's state, in a memory file other processes map (ipc_events.cpp).
struct IpcEventState {
  uint64_t recorded;  // records issued, by any process
  uint64_t done;      // highest record completed
};
// The interprocess part of cudaEventRecord, cudaStreamWaitEvent, cudaEventQuery and
// cudaEventSynchronize (ipc_events.cpp).
cudaError_t ipc_event_record(CUevent_st* e, CUstream_st* s);
cudaError_t ipc_event_wait(CUstream_st* s, CUevent_st* e);
cudaError_t ipc_event_query_or_wait(CUevent_st* e, bool block);
cudaError_t ipc_event_create(cudaEvent_t* event, unsigned flags);
}  // namespace cuda_emulator

struct CUevent_st {
  unsigned flags = 0;
  // cudaEventInterprocess: the state all processes share, and the mapping holding it.
  cuda_emulator::IpcEventState* ipc = nullptr;
  std::shared_ptr<void> ipc_file;
  // Under the global lock: the latest record (eager: a place in a stream's queue; captured: the
  // capture's nodes before it).
  bool recorded = false;
  uint64_t generation = 0;
  std::shared_ptr<cuda_emulator::Progress> progress;
  uint64_t seq = 0;
  cuda_emulator::Capture* capture = nullptr;
  std::vector<std::size_t> deps;
  // When the latest eager record ran, written by the record's operation (shared: an event may
  // be destroyed while a record is pending, as CUDA allows).
  std::shared_ptr<cuda_emulator::Stamp> stamp = std::make_shared<cuda_emulator::Stamp>();
};

struct CUgraph_st {
  std::shared_ptr<cuda_emulator::GraphData> data;
};
struct CUgraphExec_st {
  std::shared_ptr<const cuda_emulator::GraphData> data;
  // Launches of one executable graph run one after the other, whatever their streams (CUDA
  // orders each launch behind the previous one).
  std::mutex m;
  std::shared_future<void> last;
};
