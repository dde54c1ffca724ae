// The accel runtime: a small, checked, CUDA-runtime-shaped API over a device driver.
//
// No PyTorch and no Python here. Every function throws an accel::rt::Error subclass on failure
// (see error.h); none aborts. The runtime starts lazily on first use, reading its configuration
// from ACCEL_* environment variables (README has the table). `device = -1` means the calling
// thread's current device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/task.h"
#include "runtime/trace.h"
#include "runtime/types.h"

namespace accel::rt {

// --- runtime and devices ------------------------------------------------------------------
ACCEL_RT_API const char* version() noexcept;  // "0.1.0"
ACCEL_RT_API void init();                     // starts the runtime now (it also starts lazily)
ACCEL_RT_API bool is_initialized() noexcept;
// Never throws, and starts nothing (no worker, no device context) unless the runtime could not
// start with that count, when it starts it to record why (init_error; the result is then 0).
// Before the start it counts as the start would (driver_abi.h: accel_driver_count_devices). In
// a child forked after the runtime started, it still reports the count while every other call
// refuses.
ACCEL_RT_API int device_count_noexcept() noexcept;
// Why the runtime could not start ("" when it started or was not tried).
ACCEL_RT_API std::string init_error() noexcept;
// True in a child forked after the parent started the runtime (the runtime refuses to work).
ACCEL_RT_API bool in_bad_fork() noexcept;
ACCEL_RT_API int device_count();
ACCEL_RT_API const char* driver_name();
// The drivers considered at start, in order: (name, "selected" or "skipped: <why>"); with
// ACCEL_DRIVER=auto, why each driver before the selected one was not used.
ACCEL_RT_API std::vector<std::pair<std::string, std::string>> driver_selection();
// What the driver can do (graphs, host functions, timing events, host-accessible memory, native
// handles); the runtime refuses the rest with NotSupportedError.
ACCEL_RT_API DriverCapabilities driver_capabilities();
ACCEL_RT_API bool launch_blocking();
// Host execution: gives back the calling thread's idle OpenMP team, if it has one. ATen's CPU
// kernels parallelize with OpenMP, libgomp keeps a team for every thread that started a
// parallel region, and once the teams' threads outnumber the cores it stops letting any of them
// spin between regions: every region of every team then waits for its threads to wake. So a
// thread launching host tasks gives back what its own CPU work left (a model initialized on the
// CPU), and an idle stream worker gives back its own (docs/drivers.md). libgomp only
// (omp_pause_resource frees the calling thread's team); nothing with LLVM's or Intel's runtimes,
// whose pause takes every team of the process, nor inside a parallel region.
ACCEL_RT_API void give_back_openmp_team() noexcept;
ACCEL_RT_API void set_device(int device);
ACCEL_RT_API int get_device();
ACCEL_RT_API int exchange_device(int device);  // sets, returns the previous device
ACCEL_RT_API DeviceProperties get_device_properties(int device = -1);
ACCEL_RT_API MemoryInfo mem_get_info(int device = -1);
// What the device's sensor reads now (see Sensor for units and periods); NotSupportedError
// naming the driver when it has no such sensor.
ACCEL_RT_API int64_t device_sensor(Sensor sensor, int device = -1);
// The processes using the device (this one included), as the driver sees them.
ACCEL_RT_API std::vector<DeviceProcess> device_processes(int device = -1);
// Waits for all work on the device (every device when device == -2).
ACCEL_RT_API void device_synchronize(int device = -1);

// --- streams -----------------------------------------------------------------------------
ACCEL_RT_API std::pair<int, int> stream_priority_range();  // (least, greatest)
ACCEL_RT_API Stream default_stream(int device = -1);
// A new stream owned by the caller (destroy with stream_destroy). Priorities outside the range
// are clamped, like CUDA.
ACCEL_RT_API Stream stream_create(int device = -1, int priority = 0);
ACCEL_RT_API void stream_destroy(Stream stream);
// A stream from the runtime's pool (32 per device and priority, handed out round robin).
ACCEL_RT_API Stream stream_from_pool(int device = -1, int priority = 0);
ACCEL_RT_API int stream_priority(Stream stream);
// The calling thread's current stream on a device (its default stream until set).
ACCEL_RT_API Stream current_stream(int device = -1);
ACCEL_RT_API void set_current_stream(Stream stream);
// The driver's own handle of the stream (cudaStream_t on cuda); NotSupportedError where the
// driver has none.
ACCEL_RT_API void* stream_native_handle(Stream stream);
// A stream for a native handle (stream_native_handle's kind: a cudaStream_t another library
// created, on cuda): the accel stream with that handle if one is live, else the driver adopts
// the native stream without owning it (the caller keeps it alive while it is used; asking again
// gives the same stream, which stream_destroy refuses). NotSupportedError where the driver adopts
// nothing it did not create (the host driver), InvalidValueError for a handle of another device.
ACCEL_RT_API Stream stream_from_native(void* handle, int device = -1);
// `label` (may be null, else a string that outlives the call) names the work in graph debug
// dumps.
ACCEL_RT_API void launch_host_func(Stream stream, Task task, const char* label = nullptr);
ACCEL_RT_API bool stream_query(Stream stream);
ACCEL_RT_API void stream_synchronize(Stream stream);
// Throws InvalidHandleError if the stream is not live.
ACCEL_RT_API void stream_check(Stream stream);

// --- device memory (caching allocator) ----------------------------------------------------
// Returns nullptr for size 0. The block is reusable by `stream` as soon as it is freed, and by
// other streams recorded with record_stream only after they pass the point of the free.
ACCEL_RT_API void* malloc(std::size_t size, Stream stream);
ACCEL_RT_API void* malloc(std::size_t size);  // on the current stream of the current device
ACCEL_RT_API void free(void* ptr);
// Marks `ptr` (the start of an allocation) as used by `stream`.
ACCEL_RT_API void record_stream(void* ptr, Stream stream);
// The device owning a pointer into an allocation (not necessarily its start), or -1.
ACCEL_RT_API int pointer_device(const void* ptr) noexcept;
// What `ptr` is (cudaPointerGetAttributes): memory of the runtime's device or pinned-host
// allocators, or what the driver knows of memory another library allocated (copies accept such
// device memory as device memory of its device).
ACCEL_RT_API PointerAttributes pointer_attributes(const void* ptr);
// The allocation containing ptr: (start, size), or (nullptr, 0).
ACCEL_RT_API std::pair<void*, std::size_t> allocation_range(const void* ptr);
ACCEL_RT_API void empty_cache(int device = -1);  // every device when -2
// Caching on (the default) or off (ACCEL_NO_MEMORY_CACHING=1 at start): with it off, each new
// allocation of the default pool gets device memory of its own, returned to the driver when
// freed, so use after free reaches unmapped memory (a debugging aid, as CUDA's
// PYTORCH_NO_CUDA_MEMORY_CACHING). Applies to allocations made from then on.
ACCEL_RT_API void set_memory_caching(bool enabled, int device = -2);  // every device when -2
ACCEL_RT_API bool memory_caching(int device = -1);
// The caching allocator's tuning (AllocatorSettings), on every device; applies to allocations
// made from then on. InvalidValueError for a threshold outside [0, 1) or a division count that
// is not 0, 1 or a power of two.
ACCEL_RT_API void set_allocator_settings(const AllocatorSettings& settings);
ACCEL_RT_API AllocatorSettings allocator_settings();
ACCEL_RT_API DeviceStats memory_stats(int device = -1);
ACCEL_RT_API void reset_peak_memory_stats(int device = -1);
ACCEL_RT_API void reset_accumulated_memory_stats(int device = -1);
// Memory history: record allocation events (at most max_entries per device, oldest dropped),
// with the context `recorder` returns (optional) where `level` says.
ACCEL_RT_API void record_memory_history(bool enabled, ContextRecorder recorder = {},
                                        std::size_t max_entries = 100000,
                                        ContextLevel level = ContextLevel::All);
ACCEL_RT_API MemorySnapshot memory_snapshot();
// The share of the device's memory this process's caching allocator may reserve (1.0: all, the
// default); beyond it allocations fail with OutOfMemoryError as on a full device.
ACCEL_RT_API void set_memory_fraction(double fraction, int device = -1);
ACCEL_RT_API double get_memory_fraction(int device = -1);
// Called on the allocating thread when an allocation fails, before OutOfMemoryError is thrown,
// with the device, the requested bytes, the bytes allocated there and the bytes free there.
using OomObserver =
    std::function<void(int device, std::size_t requested, std::size_t allocated, std::size_t free)>;
ACCEL_RT_API void attach_oom_observer(OomObserver observer);
// Called, without the allocator's lock, when a device allocation fails even after the runtime
// released its own cached memory: a hook may free memory held elsewhere on that device (another
// library's cache, such as PyTorch's CUDA allocator on the same GPU) and returns true if it did;
// the allocation is then retried once before OutOfMemoryError. Not called during captures.
using MemoryPressureHook = std::function<bool(int device, std::size_t requested)>;
ACCEL_RT_API void attach_memory_pressure_hook(MemoryPressureHook hook);

// Memory pools (torch.cuda.MemPool): a private pool of a device's caching allocator, kept apart
// from the default pool, that the allocations of chosen threads go to. A pool lives while it
// has holders (its creator, each thread allocating to it, each graph capturing into it: the
// use count); then its free segments go back to the driver, and the rest as it is freed.
// Where a pool's segments come from (torch.cuda's CUDAPluggableAllocator functions): both null
// means the driver (raw_alloc/raw_free). `alloc` gets the segment's size, the device and the
// driver's native handle of the allocating stream (stream_native_handle; null where the driver
// has none) and returns nullptr when it has no memory; `free` gets the same pointer, size and
// device, and the handle of the stream that allocated the segment, once every stream that used
// it has passed its last free. Both are called with the allocator's lock held and the device
// bound to the thread: they must not call back into the runtime.
struct SegmentAllocator {
  void* (*alloc)(std::size_t size, int device, void* stream) = nullptr;
  void (*free)(void* ptr, std::size_t size, int device, void* stream) = nullptr;

  bool is_driver() const noexcept { return alloc == nullptr; }
  bool operator==(const SegmentAllocator&) const = default;
};
struct MemPoolOptions {
  bool use_on_oom = false;  // an allocation outside the pool that finds no memory may use it
  bool no_split = false;    // its blocks are never split (one allocation per block)
  // The pool's segments come from these functions; the driver's (the default): from the
  // device's current allocator (set_device_allocator).
  SegmentAllocator allocator;
};
// A new pool on `device`, held once by the caller.
ACCEL_RT_API PoolId mem_pool_create(int device = -1, MemPoolOptions options = {});
// Lets the caller's hold go; with no holder left, the pool's free segments go back to the
// driver now, the others once their blocks are free, at empty_cache or an out-of-memory retry
// (CUDA's ~MemPool).
ACCEL_RT_API void mem_pool_release(int device, PoolId pool);
ACCEL_RT_API int mem_pool_use_count(int device, PoolId pool);
// From now on, allocations of the calling thread on `device` (on streams that are not
// capturing) come from `pool`, which this holds; the innermost begin wins.
ACCEL_RT_API void mem_pool_begin_allocate(int device, PoolId pool);
// Ends the calling thread's innermost begin for `pool` and lets the pool go.
ACCEL_RT_API void mem_pool_end_allocate(int device, PoolId pool);

// Every device's memory from `allocator` (torch.cuda.memory.change_current_allocator), its
// segments no longer cached: each allocation of a default pool calls `allocator.alloc` for
// memory of its own and `allocator.free` once the allocation was freed and its streams passed
// the free; pools created later (MemPool, graph captures) get their segments from it and cache
// them. Only before any device memory was allocated (InvalidValueError after that, naming the
// device; also unless both functions or neither are given). The driver's: both null.
ACCEL_RT_API void set_device_allocator(SegmentAllocator allocator);
ACCEL_RT_API SegmentAllocator device_allocator();

// --- interprocess memory (runtime/ipc.cpp) ------------------------------------------------
// Device memory shared with other processes (torch.multiprocessing of device tensors, as CUDA
// IPC shares GPU memory). What the exporting process sends: the driver's handle of the segment
// that holds the allocation, where the address lies in it, and the allocation's reference
// counter in the exporter's counter file (shared host memory the importer maps).
struct IpcExport {
  int device = -1;
  IpcMemHandle handle;
  std::size_t segment_size = 0;
  std::size_t offset = 0;  // of the exported address in the segment
  int64_t ref_pid = 0;     // the exporter's process and its counter file there
  int ref_fd = -1;
  uint64_t ref_inode = 0;
  uint32_t ref_slot = 0;  // the allocation's counter in it
};
// Makes the live device allocation containing `ptr` shareable; the work queued on the device's
// current stream completes first, so the importer sees what it wrote. Each export is one
// reference the importer releases (ipc_release): until every reference is released, freeing
// the allocation here keeps it out of reuse (ipc_collect returns it once they are). Throws
// NotSupportedError where the driver cannot share memory or the allocation's segment cannot be
// shared (expandable segments, pluggable allocators), InvalidPointerError for a pointer outside
// live device memory.
ACCEL_RT_API IpcExport ipc_export(const void* ptr);
// Maps what another process exported; returns the exported address's counterpart here, on
// device `from.device` (this process's own export: the exported address itself, as CUDA does not
// open a process's own handles). Opening the same segment again reuses its mapping. Throws
// InvalidDeviceError for a device this process lacks, InvalidValueError when the exporter is
// gone or the handle is not this driver's.
ACCEL_RT_API void* ipc_import(const IpcExport& from);
// Releases one import of `ptr` (its reference in the exporter's counter; the mapping is closed
// with the segment's last import, once the streams passed work queued on it).
ACCEL_RT_API void ipc_release(void* ptr);
// Frees the allocations freed here while other processes still held them, and whose references
// are all released now; returns how many (also done when an allocation runs out of memory).
// Every device when -2.
ACCEL_RT_API std::size_t ipc_collect(int device = -2);
// Allocations freed here but held by other processes (the `ipc_collect` backlog), per device.
ACCEL_RT_API std::size_t ipc_pending(int device = -1);

// --- pinned host memory -------------------------------------------------------------------
ACCEL_RT_API void* host_malloc(std::size_t size);
ACCEL_RT_API void host_free(void* ptr);
// The pinned block is reused only after `stream` passes the point of its free.
ACCEL_RT_API void host_record_stream(void* ptr, Stream stream);
ACCEL_RT_API bool is_pinned(const void* ptr) noexcept;
ACCEL_RT_API void host_empty_cache();
ACCEL_RT_API HostStats host_memory_stats();
ACCEL_RT_API void host_reset_peak_stats();
ACCEL_RT_API void host_reset_accumulated_stats();

// --- copies -------------------------------------------------------------------------------
// Synchronous: ordered on the current stream of the device involved, returns when done.
ACCEL_RT_API void memcpy(void* dst, const void* src, std::size_t size,
                         CopyKind kind = CopyKind::Default);
// Asynchronous on `stream`. Pageable host sources are staged before returning (the caller may
// reuse them at once); copies into pageable host memory complete before returning.
ACCEL_RT_API void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind,
                               Stream stream);
ACCEL_RT_API void memset(void* dst, int value, std::size_t size);
ACCEL_RT_API void memset_async(void* dst, int value, std::size_t size, Stream stream);

// Runtime-controlled host access to device memory on drivers whose device memory is host
// memory (see Driver::host_accessible_memory). Needed under ACCEL_PROTECT_DEVICE_MEMORY=1.
ACCEL_RT_API bool device_memory_host_accessible();
class ACCEL_RT_API HostAccessGuard {
 public:
  HostAccessGuard(const void* ptr, std::size_t size);
  ~HostAccessGuard();
  HostAccessGuard(const HostAccessGuard&) = delete;
  HostAccessGuard& operator=(const HostAccessGuard&) = delete;

 private:
  int device_;
  const void* ptr_;
  std::size_t size_;
};

// --- events -------------------------------------------------------------------------------
ACCEL_RT_API Event event_create(int device = -1, bool enable_timing = false);
ACCEL_RT_API void event_destroy(Event event);
ACCEL_RT_API int event_device(Event event);
ACCEL_RT_API void event_record(Event event, Stream stream);
ACCEL_RT_API void stream_wait_event(Stream stream, Event event);
// True when the latest record has completed (or the event was never recorded).
ACCEL_RT_API bool event_query(Event event);
ACCEL_RT_API void event_synchronize(Event event);
// Milliseconds from start to end. Both must have been created with timing and completed.
ACCEL_RT_API float event_elapsed_time(Event start, Event end);
// Interprocess events (runtime/ipc.cpp; torch.cuda.Event(interprocess=True)): an event, without
// timing, that other processes open from its handle and then record, wait on, query and
// synchronize as their own event; all of them act on one completion state. Recording one inside
// a graph capture is refused (CaptureError). NotSupportedError where the driver has none.
ACCEL_RT_API Event event_create_interprocess(int device = -1);
// The handle another process passes to event_open_ipc_handle (InvalidValueError for an event
// not created by event_create_interprocess).
ACCEL_RT_API IpcEventHandle event_ipc_handle(Event event);
// An event of this process on the event another process's handle names (on `device`, the
// device that event belongs to). InvalidValueError when its process or the event is gone.
ACCEL_RT_API Event event_open_ipc_handle(int device, const IpcEventHandle& handle);

// --- graphs -------------------------------------------------------------------------------
ACCEL_RT_API PoolId graph_pool_handle();
ACCEL_RT_API Graph graph_create();
ACCEL_RT_API void graph_destroy(Graph graph);
// Starts capturing `stream` into the graph. Allocations on capturing streams come from the
// graph's private pool (`pool`, or a new one when pool is the default id).
ACCEL_RT_API void graph_capture_begin(Graph graph, Stream stream, PoolId pool = {},
                                      CaptureMode mode = CaptureMode::Global);
ACCEL_RT_API void graph_capture_end(Graph graph);
ACCEL_RT_API void graph_instantiate(Graph graph);  // optional: replay instantiates if needed
ACCEL_RT_API void graph_replay(Graph graph, Stream stream);
ACCEL_RT_API void graph_replay(Graph graph);  // on the current stream of the graph's device
// Drops the captured work and releases the graph's hold on its memory pool.
ACCEL_RT_API void graph_reset(Graph graph);
ACCEL_RT_API PoolId graph_pool(Graph graph);
ACCEL_RT_API std::size_t graph_node_count(Graph graph);
// Writes the captured nodes and their dependencies to `path` as a Graphviz dot file.
ACCEL_RT_API void graph_debug_dump(Graph graph, const std::string& path);
ACCEL_RT_API CaptureStatus stream_capture_status(Stream stream);
// The id of the capture `stream` records into (the same for every stream that joined it), 0 if
// it is not capturing. Ids are never reused within a process.
ACCEL_RT_API uint64_t stream_capture_id(Stream stream);
// True if any stream of the device is capturing.
ACCEL_RT_API bool device_is_capturing(int device = -1);
// Tells the capture `stream` records into (if any) that its work uses the device memory at
// `ptr` (call it as the work is launched, for each tensor's memory): the graph keeps the
// allocator segment holding it until the graph is reset or destroyed. empty_cache and
// out-of-memory retries then leave that segment to the driver even once the tensor there is
// freed, and a replay writes cached memory instead of memory the driver took back (on CUDA an
// illegal address). Pinned host memory of the runtime is kept alike (host_empty_cache leaves
// it). No effect when `stream` is not capturing or `ptr` is neither memory of its device's
// allocator nor pinned memory. The runtime's own captured calls (memcpy_async, memset_async)
// need none.
ACCEL_RT_API void capture_keep_memory(Stream stream, const void* ptr);
// For work the layers above cannot record into a graph (`what`, e.g. "aten::nonzero", and
// `why`): if `stream` is capturing, invalidates the capture and throws CaptureError saying so;
// otherwise does nothing.
ACCEL_RT_API void capture_refuse(Stream stream, const std::string& what, const std::string& why);

// --- tracing (profilers; see trace.h) ------------------------------------------------------
// Starts recording when host tasks run on their streams (clearing earlier records).
ACCEL_RT_API void trace_start();
// Stops recording and returns what ran since trace_start (tasks still running are not in it:
// synchronize first).
ACCEL_RT_API std::vector<trace::TaskRecord> trace_stop();
// The calling thread's tag stack: tasks it launches while recording carry the top tag.
ACCEL_RT_API void trace_push_tag(uint64_t tag);
ACCEL_RT_API void trace_pop_tag();

}  // namespace accel::rt
