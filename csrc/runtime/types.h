// Value types of the accel runtime API: handles, enums, properties and statistics.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace accel::rt {

inline constexpr int kMaxDevices = 64;

// A stream handle, like cudaStream_t but checked: using a destroyed stream raises
// InvalidHandleError instead of corrupting memory. The id is 0 for a device's default stream;
// (device, id) round-trips through Stream::from_id, which is how c10::Stream ids are formed.
class Stream {
 public:
  constexpr Stream() noexcept = default;
  static constexpr Stream from_id(int device, uint64_t id) noexcept {
    return Stream((static_cast<uint64_t>(device) << kDeviceShift) | (id & kIdMask));
  }
  static constexpr Stream from_bits(uint64_t bits) noexcept { return Stream(bits); }

  constexpr int device() const noexcept { return static_cast<int>(bits_ >> kDeviceShift); }
  constexpr uint64_t id() const noexcept { return bits_ & kIdMask; }
  constexpr uint64_t bits() const noexcept { return bits_; }
  constexpr bool is_default() const noexcept { return id() == 0; }
  constexpr uint32_t slot() const noexcept { return static_cast<uint32_t>(id() >> 32); }
  constexpr uint32_t generation() const noexcept { return static_cast<uint32_t>(id()); }

  friend constexpr bool operator==(Stream a, Stream b) noexcept { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(Stream a, Stream b) noexcept { return a.bits_ != b.bits_; }

  static constexpr int kDeviceShift = 56;
  static constexpr uint64_t kIdMask = (uint64_t{1} << kDeviceShift) - 1;

 private:
  explicit constexpr Stream(uint64_t bits) noexcept : bits_(bits) {}
  uint64_t bits_ = 0;
};

// Checked handles for events and graphs. 0 is the null handle.
template <class Tag>
class Handle {
 public:
  constexpr Handle() noexcept = default;
  static constexpr Handle from_bits(uint64_t bits) noexcept {
    Handle h;
    h.bits_ = bits;
    return h;
  }
  constexpr uint64_t bits() const noexcept { return bits_; }
  constexpr explicit operator bool() const noexcept { return bits_ != 0; }
  constexpr uint32_t slot() const noexcept { return static_cast<uint32_t>(bits_ >> 32); }
  constexpr uint32_t generation() const noexcept { return static_cast<uint32_t>(bits_); }
  friend constexpr bool operator==(Handle a, Handle b) noexcept { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(Handle a, Handle b) noexcept { return a.bits_ != b.bits_; }

 private:
  uint64_t bits_ = 0;
};
struct EventTag;
struct GraphTag;
using Event = Handle<EventTag>;
using Graph = Handle<GraphTag>;

// Identifies a memory pool of the caching allocator. {0, 0} is the default pool; graph captures
// use private pools, either their own or a shared one made by graph_pool_handle().
struct PoolId {
  uint64_t first = 0;
  uint64_t second = 0;
  constexpr bool is_default() const noexcept { return first == 0 && second == 0; }
  friend constexpr bool operator==(PoolId a, PoolId b) noexcept {
    return a.first == b.first && a.second == b.second;
  }
  friend constexpr bool operator<(PoolId a, PoolId b) noexcept {
    return a.first != b.first ? a.first < b.first : a.second < b.second;
  }
};

enum class CopyKind { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice, Default };
ACCEL_RT_API const char* copy_kind_name(CopyKind kind) noexcept;

// How strictly calls that would synchronize are refused while a capture is underway (the
// meaning of cudaStreamCaptureMode):
//  - Global: a device-wide synchronization from any thread fails and invalidates the capture.
//  - ThreadLocal: only from the thread that began the capture.
//  - Relaxed: device-wide synchronization is allowed and skips capturing streams.
// In every mode, synchronizing or querying a capturing stream, or an event recorded during the
// capture, fails and invalidates the capture.
enum class CaptureMode { Global, ThreadLocal, Relaxed };
enum class CaptureStatus { None, Active, Invalidated };
ACCEL_RT_API const char* capture_mode_name(CaptureMode mode) noexcept;

struct DeviceProperties {
  std::string name;
  std::string driver;         // "host", "cuda", "level_zero", ...
  uint64_t total_memory = 0;  // bytes
  int compute_units = 0;      // SMs, Xe cores, or worker threads for the host driver
  int major = 0;              // compute capability or equivalent
  int minor = 0;
  int max_threads_per_compute_unit = 0;
  bool integrated = false;  // shares memory with the host
  // What one generated kernel may take: arguments (buffers and scalars) and unique buffers
  // read or written. Compilers for the device (torch.compile) keep every kernel within them.
  int max_kernel_args = 0;
  int max_kernel_buffers = 0;
  // The device's UUID (CUDA's cudaDeviceProp::uuid); all zero where the driver has none.
  std::array<uint8_t, 16> uuid{};
};

// A driver's handle of device memory that another process can open (cudaIpcMemHandle_t's
// size): opaque bytes, meaningful to the same driver in a process on the same machine.
struct IpcMemHandle {
  unsigned char bytes[64] = {};
};

// A driver's handle of an interprocess event (cudaIpcEventHandle_t's size): opaque bytes, as
// IpcMemHandle.
struct IpcEventHandle {
  unsigned char bytes[64] = {};
};

struct MemoryInfo {
  uint64_t free = 0;
  uint64_t total = 0;
};

// Statistics with the meaning of PyTorch's CUDA caching allocator.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;
};
enum StatType : int { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kNumStatTypes = 3 };
using StatArray = std::array<Stat, kNumStatTypes>;

struct DeviceStats {
  StatArray allocation;      // blocks handed out
  StatArray segment;         // device allocations (reserved segments)
  StatArray active;          // blocks allocated or waiting for their streams
  StatArray inactive_split;  // free blocks that are part of a split segment
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;      // bytes asked for (before rounding)
  int64_t num_alloc_retries = 0;  // device allocations retried after freeing the cache
  int64_t num_ooms = 0;           // out-of-memory errors raised
  int64_t num_sync_all_streams = 0;
  int64_t num_device_alloc = 0;  // driver allocations
  int64_t num_device_free = 0;   // driver frees
  int64_t max_split_size = -1;   // no limit
  Stat oversize_allocations;     // kept for parity with c10; always zero (no split limit)
  Stat oversize_segments;
};

// Tuning of the device caching allocator: PyTorch's allocator settings (PYTORCH_ALLOC_CONF, read
// by the PyTorch integration) with their meaning in c10's CUDA allocator.
struct AllocatorSettings {
  // Cached blocks at least this large are never split, and serve only requests at least this
  // large (max_split_size_mb; the default: no limit).
  std::size_t max_split_size = SIZE_MAX;
  // How much larger than such a request a cached unsplit block may be (max_non_split_rounding_mb).
  std::size_t max_non_split_rounding = std::size_t{20} << 20;
  // In (0, 1): before reserving a new segment that would take the reserved memory beyond this
  // share of what the process may reserve, free cached segments, the longest unused first
  // (garbage_collection_threshold; 0: never).
  double garbage_collection_threshold = 0.0;
  // Sizes above 512 bytes round up to the next of this many equal steps between two powers of
  // two (roundup_power2_divisions); entry i is for sizes in [2^(20+i), 2^(21+i)), entry 0 also
  // for smaller ones, the last for larger ones; 0 or 1: 512-byte rounding. Empty: none.
  std::vector<std::size_t> roundup_power2_divisions;
  // Each stream's allocations of the default pools grow one reserved range of addresses, memory
  // mapped behind it as needed, instead of separate segments (expandable_segments), where the
  // driver has virtual memory (DriverCapabilities::virtual_memory).
  bool expandable_segments = false;
};

struct HostStats {
  Stat allocation;
  Stat segment;
  Stat allocated_bytes;
  Stat reserved_bytes;
  int64_t num_host_alloc = 0;
  int64_t num_host_free = 0;
};

// Memory history ----------------------------------------------------------------------------

// What a caller attaches to allocation events (for example a Python stack trace).
class HistoryContext {
 public:
  virtual ~HistoryContext() = default;
  virtual std::string to_string() const = 0;
};
using ContextRecorder = std::function<std::shared_ptr<HistoryContext>()>;
// Which history events carry a context (torch.cuda.memory._record_memory_history's `context`):
// State, only the blocks allocated now (a snapshot's); Alloc, also the trace's events, a free
// with its allocation's; All, a free with its own (the recorder runs at each free too).
enum class ContextLevel : uint8_t { State, Alloc, All };

struct TraceEntry {
  enum class Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,    // pages mapped at the end of an expandable segment
    SegmentUnmap,  // ... and unmapped from it
    Oom,
    Snapshot
  };
  Action action;
  int device = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t stream = 0;  // Stream::bits()
  int64_t time_us = 0;  // steady clock
  PoolId pool;
  std::shared_ptr<HistoryContext> context;
};
ACCEL_RT_API const char* trace_action_name(TraceEntry::Action action) noexcept;

struct BlockInfo {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;
  enum class State { ActiveAllocated, ActivePendingFree, Inactive } state = State::Inactive;
  std::shared_ptr<HistoryContext> context;
};

struct SegmentInfo {
  int device = 0;
  uint64_t addr = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  uint64_t active_size = 0;
  uint64_t requested_size = 0;
  uint64_t stream = 0;
  bool is_large = false;
  bool is_expandable = false;
  PoolId pool;
  std::vector<BlockInfo> blocks;
};

struct MemorySnapshot {
  std::vector<SegmentInfo> segments;
  std::vector<std::vector<TraceEntry>> device_traces;  // per device, oldest first
};

// What a driver can do beyond moving bytes; the runtime refuses the rest with NotSupportedError
// naming the driver (a capability query instead of calls every driver must fake).
struct DriverCapabilities {
  bool graphs = true;                   // stream capture into graphs, instantiate, launch
  bool host_functions = true;           // launch_host_func (L0 has no host-function command)
  bool timing_events = true;            // events created with timing (event_elapsed_ms)
  bool host_accessible_memory = false;  // device memory is host memory: the CPU may touch it
                                        // inside host_access_begin/end (the host driver)
  bool native_handles = false;          // stream_native_handle
  bool virtual_memory = false;          // va_reserve/va_map/va_unmap/va_release (expandable
                                        // segments)
  bool ipc_memory = false;              // ipc_get_mem_handle/ipc_open_mem_handle/
                                        // ipc_close_mem_handle (memory shared with other
                                        // processes)
  bool ipc_events = false;              // event_create_ipc/ipc_get_event_handle/
                                        // ipc_open_event_handle (events other processes wait on)
};

// What a pointer is (cudaPointerGetAttributes): memory of the runtime's allocators, or what the
// driver knows of memory another library allocated.
enum class MemoryType { Unregistered, Host, Device, Managed };
ACCEL_RT_API const char* memory_type_name(MemoryType type) noexcept;
struct PointerAttributes {
  MemoryType type = MemoryType::Unregistered;
  int device = -1;                 // device and managed memory
  bool runtime_allocated = false;  // handed out by the runtime's device or pinned-host allocator
};

// What a device's sensors report (nvidia-smi's counters; NVML on the cuda driver). Utilizations
// are percentages of the driver's last sample period (CUDA: NVML's, between 1/6 s and 1 s; host:
// the last second): time during which at least one kernel (host: one stream task) ran, and time
// during which device memory was read or written.
enum class Sensor { Utilization, MemoryUtilization, Temperature, PowerDraw, ClockRate, MemoryUsed };
ACCEL_RT_API const char* sensor_name(Sensor sensor) noexcept;  // "utilization", ...
ACCEL_RT_API const char* sensor_unit(Sensor sensor) noexcept;  // "%", "C", "mW", "MHz", "bytes"

// A process using a device and the device memory it holds (nvidia-smi's process list).
struct DeviceProcess {
  int64_t pid = 0;
  uint64_t memory = 0;
};

}  // namespace accel::rt
