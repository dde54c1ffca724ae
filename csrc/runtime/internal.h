// Internal state of the runtime, shared by its translation units. Not installed.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/driver.h"
#include "runtime/runtime.h"

namespace accel::rt::detail {

class CachingAllocator;
class HostCachingAllocator;

struct Config {
  std::string driver = "auto";
  std::string driver_path;  // where libaccel_driver_<name>.so live; default: next to the runtime
  bool launch_blocking = false;
  bool memory_caching = true;  // ACCEL_NO_MEMORY_CACHING=1: false
  // Throws InitError naming the variable when a value is malformed. Drivers read their own
  // settings (HostDriverOptions::from_env).
  static Config from_env();
};

// A fixed-capacity table of objects that are never freed while the runtime lives, addressed by
// slot. Objects carry a generation so stale handles are detected; slots are recycled.
template <class T>
class SlotTable {
 public:
  static constexpr uint32_t kChunk = 1024;
  static constexpr uint32_t kMaxChunks = 1024;

  SlotTable() {
    for (auto& c : chunks_) c.store(nullptr, std::memory_order_relaxed);
  }
  ~SlotTable() {
    for (auto& c : chunks_) {
      std::atomic<T*>* chunk = c.load();
      if (chunk == nullptr) continue;
      for (uint32_t i = 0; i < kChunk; ++i) delete chunk[i].load();
      delete[] chunk;
    }
  }

  T* get(uint32_t slot) const noexcept {
    if (slot >= kChunk * kMaxChunks) return nullptr;
    std::atomic<T*>* chunk = chunks_[slot / kChunk].load(std::memory_order_acquire);
    return chunk == nullptr ? nullptr : chunk[slot % kChunk].load(std::memory_order_acquire);
  }

  // A recycled object for which `reuse(obj)` is true, or a new one made by `make(slot)`.
  template <class Reuse, class Make>
  T* acquire(Reuse&& reuse, Make&& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t i = free_.size(); i-- > 0;) {
      T* obj = get(free_[i]);
      if (reuse(*obj)) {
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return obj;
      }
    }
    const uint32_t slot = next_;
    ACCEL_RT_CHECK(slot < kChunk * kMaxChunks, InvalidValueError, "too many live objects (", slot,
                   "): destroy streams and events you no longer use");
    std::atomic<T*>* chunk = chunks_[slot / kChunk].load(std::memory_order_acquire);
    if (chunk == nullptr) {
      chunk = new std::atomic<T*>[kChunk];
      for (uint32_t i = 0; i < kChunk; ++i) chunk[i].store(nullptr, std::memory_order_relaxed);
      chunks_[slot / kChunk].store(chunk, std::memory_order_release);
    }
    T* obj = make(slot);
    chunk[slot % kChunk].store(obj, std::memory_order_release);
    ++next_;
    return obj;
  }

  void release(uint32_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(slot);
  }

  uint32_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return next_;
  }

 private:
  std::array<std::atomic<std::atomic<T*>*>, kMaxChunks> chunks_;
  mutable std::mutex mutex_;
  std::vector<uint32_t> free_;
  uint32_t next_ = 0;
};

struct CaptureState;

// A runtime object addressed by a checked handle: its slot in a SlotTable and a generation
// that changes when the object is destroyed, so that stale handles are detected.
struct Slotted {
  uint32_t slot = 0;
  std::atomic<uint32_t> generation{1};
  std::atomic<bool> live{false};

  bool matches(uint32_t gen) const noexcept {
    return live.load(std::memory_order_acquire) &&
           generation.load(std::memory_order_acquire) == gen;
  }
  uint64_t handle_bits() const noexcept { return (uint64_t{slot} << 32) | generation.load(); }
  // Invalidates every handle to the object; the slot may then be recycled.
  void retire() noexcept {
    live.store(false, std::memory_order_release);
    if (generation.fetch_add(1, std::memory_order_acq_rel) + 1 == 0) generation.store(1);
  }
};

// The live object `table` holds for (slot, generation), or InvalidHandleError naming the call,
// the handle (`describe()` runs only on failure) and its kind ("stream", "event", "graph").
template <class T, class Describe>
T& checked(const SlotTable<T>& table, uint32_t slot, uint32_t gen, const char* call,
           const char* kind, Describe&& describe) {
  T* obj = table.get(slot);
  ACCEL_RT_CHECK(obj != nullptr && obj->matches(gen), InvalidHandleError, call, ": ", describe(),
                 obj != nullptr ? " was destroyed" : std::string(" is not a valid ") + kind);
  return *obj;
}

struct StreamObj : Slotted {
  int device = 0;
  int priority = 0;
  bool pooled = false;
  bool external = false;  // adopted from a native handle (stream_from_native): never destroyed
  DriverStream ds = nullptr;
  std::atomic<bool> capturing{false};  // fast check; details under Runtime::capture_mutex
  CaptureState* capture = nullptr;     // under Runtime::capture_mutex

  Stream handle() const noexcept { return Stream::from_id(device, handle_bits()); }
};

struct EventObj : Slotted {
  int device = 0;
  bool timing = false;
  bool interprocess = false;  // made by event_create_interprocess or event_open_ipc_handle
  bool ipc_own = false;       // made by event_create_interprocess: its handle is this
  IpcEventHandle ipc_handle;  // process's, as listed by ipc.cpp
  DriverEvent de = nullptr;
  std::atomic<bool> recorded{false};
  // The capture this event was last recorded in (0: last recorded eagerly).
  std::atomic<uint64_t> capture_id{0};

  Event handle() const noexcept { return Event::from_bits(handle_bits()); }
};

// ipc.cpp: an interprocess event of this process is destroyed (its handle no longer names one
// of this process's events).
void forget_own_ipc_event(const IpcEventHandle& handle);

struct CaptureState {
  uint64_t id = 0;
  int device = 0;
  StreamObj* origin = nullptr;
  CaptureMode mode = CaptureMode::Global;
  std::thread::id thread;
  PoolId pool;
  std::vector<StreamObj*> streams;       // origin first, then streams that joined
  std::string invalidated;               // why the capture was invalidated ("" while valid)
  std::unordered_set<const void*> used;  // memory its work uses (capture_keep_memory)
  std::vector<uintptr_t> kept;           // the allocator segments holding it, kept
  std::vector<uintptr_t> kept_host;      // and the pinned blocks
};

struct GraphObj : Slotted {
  enum class State { Empty, Capturing, Captured };
  std::mutex m;
  State state = State::Empty;
  int device = -1;
  PoolId pool;
  bool holds_pool = false;
  std::unique_ptr<CaptureState> capture;
  DriverGraph dg = nullptr;
  DriverGraphExec exec = nullptr;
  std::size_t nodes = 0;
  std::vector<uintptr_t> kept;       // allocator segments its work uses (CaptureState::kept)
  std::vector<uintptr_t> kept_host;  // and pinned blocks

  Graph handle() const noexcept { return Graph::from_bits(handle_bits()); }
};

inline constexpr int kPoolStreamsPerPriority = 32;
inline constexpr int kMaxPriorityLevels = 8;

struct DeviceState {
  int index = 0;
  SlotTable<StreamObj> streams;  // slot 0: the default stream
  std::array<std::array<std::atomic<StreamObj*>, kPoolStreamsPerPriority>, kMaxPriorityLevels>
      pool{};
  std::array<std::atomic<uint32_t>, kMaxPriorityLevels> pool_next{};
  std::mutex pool_mutex;  // also serializes adopting native streams (stream_from_native)
  std::unique_ptr<CachingAllocator> allocator;
  std::atomic<int> captures{0};  // captures underway on this device
  // Asked of the driver once (a driver's properties do not change; on cuda each ask is a
  // cudaGetDeviceProperties), as ATen's CUDA device properties.
  std::once_flag properties_once;
  DeviceProperties properties;

  // Driver events reused for allocator bookkeeping (record_stream).
  std::mutex event_pool_mutex;
  std::vector<DriverEvent> event_pool;
};

// While alive, the calling thread's capture mode is relaxed: memory for a capture may be
// allocated during it (c10's cudaMallocMaybeCapturing relaxes the mode the same way).
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(Driver& d)
      : driver_(d), previous_(d.thread_capture_mode_exchange(CaptureMode::Relaxed)) {}
  ~RelaxedCaptureMode() { driver_.thread_capture_mode_exchange(previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  Driver& driver_;
  CaptureMode previous_;
};

class Runtime {
 public:
  // Starts the runtime on first call; throws InitError if it cannot start (every time).
  static Runtime& get();
  static Runtime* get_if_initialized() noexcept;

  Config config;
  Driver* driver = nullptr;
  DriverCapabilities capabilities;  // the driver's, asked once at start
  // The drivers the runtime considered, in order: (name, "selected" or "skipped: <why>").
  std::vector<std::pair<std::string, std::string>> driver_selection;
  int num_devices = 0;
  std::pair<int, int> priority_range{0, 0};
  std::vector<std::unique_ptr<DeviceState>> devices;
  SlotTable<EventObj> events;
  SlotTable<GraphObj> graphs;
  std::unique_ptr<HostCachingAllocator> host_allocator;

  std::mutex capture_mutex;
  std::unordered_map<uint64_t, CaptureState*> live_captures;  // under capture_mutex
  std::atomic<uint64_t> next_capture_id{1};
  std::atomic<uint64_t> next_pool_id{1};

  // Validation ------------------------------------------------------------------------
  int resolve_device(int device, const char* call) const;  // -1: current device
  std::string device_range_text() const;                   // "there are 2 accel devices ..."
  DeviceState& device_state(int device, const char* call) {
    return *devices[static_cast<std::size_t>(resolve_device(device, call))];
  }
  StreamObj& stream(Stream s, const char* call);
  EventObj& event(Event e, const char* call);
  GraphObj& graph(Graph g, const char* call);
  StreamObj& default_stream_obj(int device) { return *devices[device]->streams.get(0); }
  StreamObj& current_stream_obj(int device);

  // Capture rules -----------------------------------------------------------------------
  // The private pool allocations on `s` must come from (default pool if not capturing).
  PoolId capture_pool(StreamObj& s);
  // Throws CaptureError and invalidates the capture if `s` is capturing.
  void check_not_capturing(StreamObj& s, const char* call);
  // Applies the capture modes to a device-wide synchronizing call; returns false when
  // capturing streams must be skipped (relaxed / other thread in thread-local mode).
  bool check_device_sync(int device, const char* call);
  // CUDA's rule for calls that may synchronize (see Driver::thread_capture_mode_exchange):
  // invalidates and throws if a capture underway forbids `what` on this thread (a capture this
  // thread began that is not relaxed, or another thread's global capture).
  void check_unsafe_call(const std::string& what, const char* why);
  // For a call that is about to queue work on `s` and then wait for it (not capturing `s`
  // itself): refuses it, as check_unsafe_call, while a capture elsewhere forbids the wait, so
  // that nothing is queued that would run after the refusal (into memory the caller frees as
  // it unwinds). Named "<call>(<stream>)".
  void check_wait_allowed(StreamObj& s, const char* call);
  // Whether any capture is underway on any device (the allocators then make no driver call
  // CUDA forbids during capture: no event query, no free).
  bool capturing_anywhere() const {
    for (const auto& d : devices) {
      if (d->captures.load(std::memory_order_acquire) > 0) return true;
    }
    return false;
  }
  void check_event_not_captured(EventObj& e, const char* call);
  // capture_keep_memory for `s`: the first use of `ptr` in its capture keeps the segment.
  void keep_for_capture(StreamObj& s, const void* ptr);
  // Invalidates the capture of `s` (if any) and throws CaptureError: `what` cannot be captured.
  void refuse_capture(StreamObj& s, const std::string& what, const std::string& why);

  // Synchronizes every stream of a device (skipping capturing ones when told to).
  void synchronize_streams(int device, bool skip_capturing);

  // A live stream object: recycled for stream_create (same priority) unless pooled.
  StreamObj* acquire_stream(int device, int priority, bool pooled);

  DriverEvent pool_event(int device);
  void return_event(int device, DriverEvent ev);

  // A started runtime lives for the whole process (stream workers may still run at exit) and
  // is never destroyed; only a runtime that failed to start is.
  ~Runtime() = default;

 private:
  Runtime() = default;
  void start();
  // `why`: why `what` is refused (default: it would wait for work only being recorded).
  [[noreturn]] void invalidate_and_throw(CaptureState& cs, const std::string& what,
                                         const char* why = nullptr);
  // The host driver, or the runtime's view of a library's C table (whose destroy frees what
  // the library made, inside the library).
  std::unique_ptr<Driver> owned_driver_;
};

// A Driver over the C table that the accel_driver_open (`open_symbol`) of `library` fills
// (runtime/driver_abi.h); nullptr with `why` set when the library refuses (its message) or its
// table is unusable (named with `library`).
std::unique_ptr<Driver> open_driver_table(void* open_symbol, const std::string& library,
                                          std::string& why);

// Runs the memory pressure hooks for a failed allocation on `device` (memory.cpp); true if one
// freed memory.
bool relieve_memory_pressure(int device, std::size_t requested);
// Interprocess memory (ipc.cpp): true when free(ptr) must keep the allocation because another
// process still holds it (it is freed by ipc_collect); the device of memory imported from
// another process (-1: none).
bool ipc_keeps(const void* ptr);
int ipc_device_of(const void* ptr);

// The calling thread's current device (0 until set), validated lazily.
int tls_device();
void set_tls_device(int device);

std::string describe(Stream s);
std::string describe(PoolId p);

}  // namespace accel::rt::detail
