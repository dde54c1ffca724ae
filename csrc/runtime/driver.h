// The driver interface: the one table of functions each device driver implements.
//
// Everything above it (handles and their validation, the caching allocators, stream pools,
// current device and stream, graph objects and private memory pools, capture rules, statistics,
// error messages) is written once in the runtime. A driver only moves bytes and runs work.
//
// Each call's comment says how it maps onto CUDA (the `cuda` driver) and onto Level Zero (the
// `level_zero` driver); docs/drivers.md has the same table. The embedded `host` driver
// implements every call with host memory and one worker thread per stream.
//
// Rules for implementations:
//  - Calls are made with validated arguments: device indices are in range, handles are live,
//    sizes are non-zero unless stated. Drivers may assume that.
//  - raw_alloc/host_alloc return nullptr when memory is exhausted; they never throw for that.
//  - Any other failure throws accel::rt::Error (DriverError when nothing more specific fits).
//  - Work submitted to a stream that is capturing is recorded into the capture, not executed.
//  - Drivers loaded with dlopen meet the runtime through the C table of runtime/driver_abi.h;
//    a driver written against this class fills it with export_driver (runtime/driver_export.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/task.h"
#include "runtime/types.h"

namespace accel::rt {

// Opaque driver objects. Their meaning belongs to the driver.
struct DriverStreamT;
struct DriverEventT;
struct DriverGraphT;
struct DriverGraphExecT;
using DriverStream = DriverStreamT*;
using DriverEvent = DriverEventT*;
using DriverGraph = DriverGraphT*;
using DriverGraphExec = DriverGraphExecT*;

class ACCEL_RT_API Driver {
 public:
  virtual ~Driver();

  // --- identity and devices -------------------------------------------------------------
  virtual std::string_view name() const = 0;
  // CUDA: cudaGetDeviceCount.            L0: zeDeviceGet over the GPU driver.
  virtual int device_count() = 0;
  // CUDA: cudaGetDeviceProperties.       L0: zeDeviceGetProperties + zeDeviceGetMemoryProperties.
  virtual DeviceProperties device_properties(int device) = 0;
  // Binds the device to the calling thread before the runtime works on it.
  // CUDA: cudaSetDevice.                 L0: nothing (contexts are not per thread).
  virtual void set_device(int device) = 0;
  // CUDA: cudaMemGetInfo.                L0: zesMemoryGetState, or total minus the driver's count.
  virtual MemoryInfo mem_get_info(int device) = 0;
  virtual DriverCapabilities capabilities() const { return {}; }
  // A sentence the runtime adds to out-of-memory errors: how to give the device more memory
  // (the host driver names ACCEL_HOST_MEMORY). Empty: nothing to add.
  virtual std::string oom_hint() const { return {}; }

  // --- raw memory -----------------------------------------------------------------------
  // CUDA: cudaMalloc / cudaFree.         L0: zeMemAllocDevice / zeMemFree.
  virtual void* raw_alloc(int device, std::size_t size) = 0;
  virtual void raw_free(int device, void* ptr, std::size_t size) = 0;
  // Page-locked host memory for asynchronous copies.
  // CUDA: cudaHostAlloc / cudaFreeHost.  L0: zeMemAllocHost / zeMemFree.
  virtual void* host_alloc(std::size_t size) = 0;
  virtual void host_free(void* ptr, std::size_t size) = 0;
  // Runtime-controlled host access to device memory (host driver only; a debug mode may
  // keep device memory inaccessible outside these brackets). Nested and concurrent calls
  // are reference counted.
  virtual void host_access_begin(int device, const void* ptr, std::size_t size);
  virtual void host_access_end(int device, const void* ptr, std::size_t size);

  // --- streams --------------------------------------------------------------------------
  // (least, greatest) priority, CUDA's convention: lower numbers run first.
  // CUDA: cudaDeviceGetStreamPriorityRange.  L0: ZE_COMMAND_QUEUE_PRIORITY_{LOW,NORMAL,HIGH}.
  virtual std::pair<int, int> stream_priority_range() = 0;
  // CUDA: cudaStreamCreateWithPriority(cudaStreamNonBlocking).
  // L0: zeCommandListCreateImmediate on a compute queue group ordinal, with the priority.
  virtual DriverStream stream_create(int device, int priority) = 0;
  // Waits for the stream's work, then releases it.
  // CUDA: cudaStreamSynchronize + cudaStreamDestroy.  L0: zeCommandListHostSynchronize + Destroy.
  virtual void stream_destroy(DriverStream stream) = 0;
  // The vendor's handle of the stream, for libraries that take one (torch.Stream.native_handle,
  // Inductor's raw stream, NCCL); nullptr: the driver has none (the runtime then says so).
  // CUDA: the cudaStream_t.  L0: the ze_command_list_handle_t.  Host: the driver's stream object.
  virtual void* stream_native_handle(DriverStream stream) {
    (void)stream;
    return nullptr;
  }
  // A driver stream over a native handle the driver did not create (another library's), and its
  // priority; the stream is not owned: stream_destroy is never called on it. The default throws
  // NotSupportedError; InvalidValueError for a handle of another device.
  // CUDA: the cudaStream_t (cudaStreamGetDevice, cudaStreamGetPriority).  L0: the command list.
  virtual DriverStream stream_adopt(int device, void* native, int* priority);
  // Runs `task` on the host in stream order.
  // CUDA: cudaLaunchHostFunc.
  // L0: no host-function command: append a signal of an event that a runtime thread waits on
  //     (zeEventHostSynchronize), runs the task and then signals a second event that the list
  //     waits on (zeCommandListAppendWaitOnEvents).
  // `label` (may be null) says what the task does, for graph debug dumps; drivers may ignore it.
  virtual void launch_host_func(DriverStream stream, Task task, const char* label) = 0;
  // `kind` is resolved (never Default). Pageable host memory has been staged or the stream is
  // synchronized afterwards by the runtime, so drivers may treat host pointers as pinned.
  // CUDA: cudaMemcpyAsync.               L0: zeCommandListAppendMemoryCopy.
  virtual void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind,
                            DriverStream stream) = 0;
  // CUDA: cudaMemsetAsync.               L0: zeCommandListAppendMemoryFill (1-byte pattern).
  virtual void memset_async(void* dst, int value, std::size_t size, DriverStream stream) = 0;
  // True when every task submitted so far has completed (a running task counts as pending).
  // CUDA: cudaStreamQuery.               L0: zeEventQueryStatus on the list's last signal.
  virtual bool stream_query(DriverStream stream) = 0;
  // Waits for every task submitted before the call. Throws TaskError if one of them failed.
  // CUDA: cudaStreamSynchronize.         L0: zeCommandListHostSynchronize.
  virtual void stream_synchronize(DriverStream stream) = 0;

  // --- events ---------------------------------------------------------------------------
  // CUDA: cudaEventCreateWithFlags (cudaEventDisableTiming unless timing).
  // L0: zeEventCreate from a pool made with ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP when timing.
  virtual DriverEvent event_create(int device, bool timing) = 0;
  virtual void event_destroy(DriverEvent event) = 0;
  // Completes when the stream reaches this point. If the stream is capturing, the event
  // becomes a dependency marker inside the capture.
  // CUDA: cudaEventRecord.               L0: zeCommandListAppendSignalEvent (after a reset).
  virtual void event_record(DriverEvent event, DriverStream stream) = 0;
  // Work submitted to `stream` afterwards waits for the event's latest record. An event
  // recorded in a capture makes a non-capturing stream join that capture.
  // CUDA: cudaStreamWaitEvent.           L0: zeCommandListAppendWaitOnEvents.
  virtual void stream_wait_event(DriverStream stream, DriverEvent event) = 0;
  // CUDA: cudaEventQuery.                L0: zeEventQueryStatus.
  virtual bool event_query(DriverEvent event) = 0;
  // CUDA: cudaEventSynchronize.          L0: zeEventHostSynchronize.
  virtual void event_synchronize(DriverEvent event) = 0;
  // Both events are completed and were created with timing.
  // CUDA: cudaEventElapsedTime.          L0: zeEventQueryKernelTimestamp × timer resolution.
  virtual float event_elapsed_ms(DriverEvent start, DriverEvent end) = 0;

  // --- graphs ---------------------------------------------------------------------------
  // CUDA: cudaStreamBeginCapture(mode).  L0: record into a regular command list instead of
  //                                          the immediate one.
  virtual void stream_begin_capture(DriverStream stream, CaptureMode mode) = 0;
  // Ends the capture begun on `stream`; every stream that joined it leaves it too. Throws
  // CaptureError (CaptureUnjoined) if a joined stream was not joined back; the capture is
  // ended and discarded in that case.
  // CUDA: cudaStreamEndCapture.          L0: zeCommandListClose.
  virtual DriverGraph stream_end_capture(DriverStream stream) = 0;
  // CUDA: cudaGraphGetNodes(count).      L0: the number of recorded commands.
  virtual std::size_t graph_node_count(DriverGraph graph) = 0;
  // CUDA: cudaGraphInstantiate.          L0: nothing, or zeCommandListCreateCloneExp.
  virtual DriverGraphExec graph_instantiate(DriverGraph graph) = 0;
  // Launches of one executable graph run one after the other, in launch order.
  // CUDA: cudaGraphLaunch.               L0: zeCommandListImmediateAppendCommandListsExp.
  virtual void graph_launch(DriverGraphExec exec, DriverStream stream) = 0;
  // CUDA: cudaGraphDestroy / cudaGraphExecDestroy.   L0: zeCommandListDestroy.
  virtual void graph_destroy(DriverGraph graph) = 0;
  virtual void graph_exec_destroy(DriverGraphExec exec) = 0;
  // Writes the graph's nodes and their dependencies to `path` as a Graphviz dot file. The
  // default throws NotSupportedError.
  // CUDA: cudaGraphDebugDotPrint(cudaGraphDebugDotFlagsVerbose).   L0: none.
  virtual void graph_debug_dump(DriverGraph graph, const char* path);
  // Sets the calling thread's capture mode, returning the previous one. While a capture is
  // underway, calls that may synchronize (allocating or freeing device memory, querying or
  // waiting for streams and events) are refused from threads whose mode is not relaxed, as
  // CUDA refuses them; the runtime relaxes the mode around an allocation made for the
  // capturing stream itself. The default does nothing (a driver without such rules).
  // CUDA: cudaThreadExchangeStreamCaptureMode.   L0: nothing.
  virtual CaptureMode thread_capture_mode_exchange(CaptureMode mode) { return mode; }

  // --- virtual memory (capabilities().virtual_memory) ----------------------------------
  // The unit of va_map/va_unmap (sizes and offsets are multiples of it).
  // CUDA: cuMemGetAllocationGranularity.  L0: zeVirtualMemQueryPageSize.  Host: 2 MiB.
  virtual std::size_t va_granularity(int device);
  // Reserves `size` bytes of device addresses with no memory behind them; nullptr if refused.
  // CUDA: cuMemAddressReserve.  L0: zeVirtualMemReserve.  Host: a memfd of that size mapped
  // PROT_NONE, MAP_SHARED, MAP_NORESERVE.
  virtual void* va_reserve(int device, std::size_t size);
  // Releases a reservation whose memory is all unmapped.
  // CUDA: cuMemAddressFree.  L0: zeVirtualMemFree.  Host: munmap.
  virtual void va_release(int device, void* ptr, std::size_t size);
  // Puts device memory behind [ptr, ptr + size) of a reservation; false when the device has
  // no memory left for it (nothing mapped then).
  // CUDA: cuMemCreate + cuMemMap + cuMemSetAccess.  L0: zePhysicalMemCreate + zeVirtualMemMap.
  // Host: the pages made accessible, counted against the capacity.
  virtual bool va_map(int device, void* ptr, std::size_t size);
  // Takes the memory away once the work submitted before the call has passed it (as raw_free).
  // CUDA: cuMemUnmap + cuMemRelease.  L0: zeVirtualMemUnmap + zePhysicalMemDestroy.
  // Host: the pages punched out of the file and PROT_NONE, deferred until the streams pass.
  virtual void va_unmap(int device, void* ptr, std::size_t size);

  // --- interprocess memory (capabilities().ipc_memory) -----------------------------------
  // A handle of device memory that another process opens to map the same memory
  // (torch.multiprocessing of device tensors): [base, base + size) is an allocation raw_alloc
  // returned, or memory mapped inside one reservation (va_map: an expandable segment).
  // NotSupportedError for memory the driver cannot share (the default: any).
  // CUDA: cudaIpcGetMemHandle (not for cuMem* memory).  L0: zeMemGetIpcHandle.  Host: the
  // memory file (memfd) of the device or of the reservation, the range in it, and the process.
  virtual IpcMemHandle ipc_get_mem_handle(int device, void* base, std::size_t size);
  // Maps memory of another process from its handle; `*size` is the allocation's size, or 0
  // where the driver cannot tell (the runtime then knows it from the exporter). InvalidValueError
  // for a handle that is not this driver's or whose process or memory is gone. CUDA:
  // cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) (size 0). L0: zeMemOpenIpcHandle.  Host:
  // mmap of the other process's memory file.
  virtual void* ipc_open_mem_handle(int device, const IpcMemHandle& handle, std::size_t* size);
  // Unmaps what ipc_open_mem_handle returned (the memory stays with its owner).
  // CUDA: cudaIpcCloseMemHandle.  L0: zeMemCloseIpcHandle.  Host: munmap.
  virtual void ipc_close_mem_handle(int device, void* ptr);

  // --- interprocess events (capabilities().ipc_events) -----------------------------------
  // An event that other processes can open, record and wait on (torch.cuda.Event(interprocess=
  // True)), without timing; destroyed with event_destroy. The default throws NotSupportedError.
  // CUDA: cudaEventCreateWithFlags(cudaEventInterprocess | cudaEventDisableTiming).  L0: an
  // event of a pool created with ZE_EVENT_POOL_FLAG_IPC.  Host: the event's counters in a
  // memory file (memfd) of the driver's, waited on with futexes.
  virtual DriverEvent event_create_ipc(int device);
  // The handle another process opens. CUDA: cudaIpcGetEventHandle.  L0: zeEventPoolGetIpcHandle
  // and the index.  Host: the memory file, the slot in it, and the process.
  virtual IpcEventHandle ipc_get_event_handle(DriverEvent event);
  // An event of this process that is the other process's event: its records, waits and queries
  // act on the same completion state. Destroyed with event_destroy (the event stays with its
  // creator). InvalidValueError for a handle that is not this driver's or whose process is gone.
  // CUDA: cudaIpcOpenEventHandle.  L0: zeEventPoolOpenIpcHandle.  Host: mmap of the file.
  virtual DriverEvent ipc_open_event_handle(int device, const IpcEventHandle& handle);

  // --- sensors ------------------------------------------------------------------------
  // What a sensor of the device reads now (units and periods: Sensor). The default throws
  // NotSupportedError, as should a driver for a sensor its device lacks.
  // CUDA: NVML (nvmlDeviceGetUtilizationRates, GetTemperature, GetPowerUsage, GetClockInfo,
  //       GetMemoryInfo).    L0: Sysman (zesEngineGetActivity, zesTemperatureGetState, ...).
  virtual int64_t device_sensor(int device, Sensor sensor);
  // The processes using the device. The default throws NotSupportedError.
  // CUDA: nvmlDeviceGetComputeRunningProcesses.   L0: zesDeviceProcessesGetState.
  virtual std::vector<DeviceProcess> device_processes(int device);

  // --- memory of others -----------------------------------------------------------------
  // What the driver knows of `ptr`, memory the runtime did not allocate (another library's
  // device memory, registered host memory); runtime_allocated is not the driver's to set. The
  // default: ordinary host memory.
  // CUDA: cudaPointerGetAttributes.      L0: zeMemGetAllocProperties.
  virtual PointerAttributes pointer_attributes(const void* ptr) {
    (void)ptr;
    return {};
  }
};

// The embedded host driver, also used by plugins that wrap it in tests.
struct HostDriverOptions {
  std::string name = "host";
  int devices = 2;
  uint64_t memory_per_device = uint64_t{4} << 30;
  bool protect_device_memory = false;
  bool launch_blocking = false;
  // Kernel limits reported in DeviceProperties (ACCEL_MAX_KERNEL_ARGS / _BUFFERS). Host
  // kernels are C++ functions: the defaults keep generated functions and their argument
  // packing small (Inductor's own C++ backend flushes at 500 arguments).
  int max_kernel_args = 256;
  int max_kernel_buffers = 64;
  // What the driver reports it can do (and then refuses, through the runtime, what it leaves
  // out: tests use this to stand in for drivers without graphs or timing).
  DriverCapabilities capabilities{.host_accessible_memory = true,
                                  .native_handles = true,
                                  .virtual_memory = true,
                                  .ipc_memory = true,
                                  .ipc_events = true};

  // ACCEL_HOST_DEVICES, ACCEL_HOST_MEMORY, ACCEL_LAUNCH_BLOCKING, ACCEL_PROTECT_DEVICE_MEMORY,
  // ACCEL_MAX_KERNEL_ARGS and ACCEL_MAX_KERNEL_BUFFERS (InitError naming a malformed one).
  ACCEL_RT_API static HostDriverOptions from_env();
};
ACCEL_RT_API std::unique_ptr<Driver> make_host_driver(const HostDriverOptions& options);

}  // namespace accel::rt
