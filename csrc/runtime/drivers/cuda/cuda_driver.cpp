// The cuda driver: every driver call on the CUDA runtime (libaccel_driver_cuda.so, loaded by the
// runtime with dlopen; torch-free). Built where the CUDA toolkit is found; cudart is linked
// statically, so the library loads without a GPU and says why it cannot run (no driver, no
// device) instead of failing to load.
//
// Host tasks: cudaLaunchHostFunc with a heap payload. A task launched while its stream is
// capturing becomes a host node that runs at every replay, so its payload belongs to the capture
// and then to the graph (and its executable instances); an eager task's payload is freed after it
// runs. A host task that throws cannot report through CUDA: its message is kept for its device
// and the next stream or event synchronize on that device throws TaskError with it.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/driver_export.h"
#include "runtime/drivers/cuda/nvml.h"
#include "runtime/drivers/cuda/visible_devices.h"
#include "runtime/drivers/cuda/vmm.h"
#include "runtime/error.h"

namespace accel::rt {
namespace {

// Errors after which the CUDA context is unusable: every later call fails with them too.
bool sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert: return true;
    default: return false;
  }
}

[[noreturn]] void throw_cuda(cudaError_t e, const char* call) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  std::string what =
      std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  // The runtime keeps the device lost from here on and refuses every later call.
  if (sticky(e)) throw DeviceLostError(what, __FILE__, __LINE__);
  switch (e) {
    case cudaErrorMemoryAllocation: throw OutOfMemoryError(what, __FILE__, __LINE__);
    case cudaErrorInvalidValue: throw InvalidValueError(what, __FILE__, __LINE__);
    case cudaErrorInvalidDevice: throw InvalidDeviceError(what, __FILE__, __LINE__);
    case cudaErrorInvalidResourceHandle: throw InvalidHandleError(what, __FILE__, __LINE__);
    case cudaErrorNotReady: throw NotReadyError(what, __FILE__, __LINE__);
    case cudaErrorNotSupported: throw NotSupportedError(what, __FILE__, __LINE__);
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorCapturedEvent: throw CaptureError(what, __FILE__, __LINE__);
    case cudaErrorStreamCaptureUnjoined:
      throw CaptureError(ErrorCode::CaptureUnjoined,
                         what +
                             ": a stream joined the capture but its work was not joined back "
                             "into the origin stream before capture_end; record an event on it "
                             "and make the origin stream wait on it",
                         __FILE__, __LINE__);
    default: throw DriverError(what, __FILE__, __LINE__);
  }
}

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) throw_cuda(e, call);
}

// A query's answer: done (cudaSuccess) or not yet (cudaErrorNotReady, not an error).
bool completed(cudaError_t e, const char* call) {
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(e, call);
  return true;
}

cudaStreamCaptureMode to_cuda(CaptureMode mode) {
  switch (mode) {
    case CaptureMode::Global: return cudaStreamCaptureModeGlobal;
    case CaptureMode::ThreadLocal: return cudaStreamCaptureModeThreadLocal;
    case CaptureMode::Relaxed: return cudaStreamCaptureModeRelaxed;
  }
  return cudaStreamCaptureModeGlobal;
}

CaptureMode from_cuda(cudaStreamCaptureMode mode) {
  switch (mode) {
    case cudaStreamCaptureModeThreadLocal: return CaptureMode::ThreadLocal;
    case cudaStreamCaptureModeRelaxed: return CaptureMode::Relaxed;
    default: return CaptureMode::Global;
  }
}

cudaMemcpyKind to_cuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToHost: return cudaMemcpyHostToHost;
    case CopyKind::HostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::DeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::DeviceToDevice: return cudaMemcpyDeviceToDevice;
    case CopyKind::Default: return cudaMemcpyDefault;
  }
  return cudaMemcpyDefault;
}

class CudaDriver;

// What cudaLaunchHostFunc runs.
struct HostPayload {
  CudaDriver* driver;
  int device;
  Task task;
  bool owned_by_capture;
};
using Payloads = std::vector<std::unique_ptr<HostPayload>>;

struct CudaStreamObj {
  cudaStream_t stream = nullptr;
  int device = 0;
  bool owned = true;  // false: adopted from another library (stream_adopt)
};
struct CudaEventObj {
  cudaEvent_t event = nullptr;
  int device = 0;
};
struct CudaGraphObj {
  cudaGraph_t graph = nullptr;
  std::shared_ptr<Payloads> payloads;
};
struct CudaGraphExecObj {
  cudaGraphExec_t exec = nullptr;
  std::shared_ptr<Payloads> payloads;  // host nodes run these at every launch
};

CudaStreamObj* as_stream(DriverStream s) {
  return reinterpret_cast<CudaStreamObj*>(s);
}
CudaEventObj* as_event(DriverEvent e) {
  return reinterpret_cast<CudaEventObj*>(e);
}
CudaGraphObj* as_graph(DriverGraph g) {
  return reinterpret_cast<CudaGraphObj*>(g);
}
CudaGraphExecObj* as_exec(DriverGraphExec e) {
  return reinterpret_cast<CudaGraphExecObj*>(e);
}

class CudaDriver final : public Driver {
 public:
  explicit CudaDriver(int devices) : devices_(devices), failures_(devices) {
    vmm_ok_ = vmm_.load(0, vmm_why_);  // expandable segments where the GPU and driver have it
  }

  std::string_view name() const override { return "cuda"; }
  int device_count() override { return devices_; }

  DeviceProperties device_properties(int device) override {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    DeviceProperties out;
    out.name = p.name;
    out.driver = "cuda";
    out.total_memory = p.totalGlobalMem;
    out.compute_units = p.multiProcessorCount;
    out.major = p.major;
    out.minor = p.minor;
    out.max_threads_per_compute_unit = p.maxThreadsPerMultiProcessor;
    out.integrated = p.integrated != 0;
    // Kernel parameters: 32764 bytes since CUDA 12.1 on Volta and later (8-byte arguments).
    out.max_kernel_args = 4095;
    out.max_kernel_buffers = 4095;
    static_assert(sizeof(p.uuid.bytes) == sizeof(out.uuid));
    std::memcpy(out.uuid.data(), p.uuid.bytes, sizeof(out.uuid));
    return out;
  }

  void set_device(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }

  MemoryInfo mem_get_info(int device) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return {free, total};
  }

  DriverCapabilities capabilities() const override {
    DriverCapabilities c;
    c.graphs = true;
    c.host_functions = true;
    c.timing_events = true;
    c.host_accessible_memory = false;
    c.native_handles = true;
    c.virtual_memory = vmm_ok_;
    c.ipc_memory = true;
    c.ipc_events = true;
    return c;
  }

  void* raw_alloc(int device, std::size_t size) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;  // the runtime frees its cache and retries, or reports out of memory
    }
    check(e, "cudaMalloc");
    return p;
  }
  void raw_free(int device, void* ptr, std::size_t) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaFree(ptr), "cudaFree");
  }
  // Interprocess memory: CUDA IPC handles of cudaMalloc'd segments.
  IpcMemHandle ipc_get_mem_handle(int device, void* base, std::size_t) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaIpcMemHandle_t h{};
    const cudaError_t e = cudaIpcGetMemHandle(&h, base);
    if (e == cudaErrorInvalidValue && vmm_ok_) {
      (void)cudaGetLastError();
      ACCEL_RT_THROW(NotSupportedError,
                     "the cuda driver cannot share memory it maps page by "
                     "page (expandable segments, cuMem*) with other processes yet (",
                     cudaGetErrorName(e), " from cudaIpcGetMemHandle)");
    }
    check(e, "cudaIpcGetMemHandle");
    IpcMemHandle out;
    static_assert(sizeof(h) == sizeof(out.bytes));
    std::memcpy(out.bytes, &h, sizeof(h));
    return out;
  }
  void* ipc_open_mem_handle(int device, const IpcMemHandle& handle, std::size_t* size) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.bytes, sizeof(h));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    *size = 0;  // the exporter's runtime knows it
    return p;
  }
  void ipc_close_mem_handle(int device, void* ptr) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle");
  }
  void* host_alloc(std::size_t size) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(e, "cudaHostAlloc");
    return p;
  }
  void host_free(void* ptr, std::size_t) override { check(cudaFreeHost(ptr), "cudaFreeHost"); }

  std::pair<int, int> stream_priority_range() override {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    return {least, greatest};
  }
  DriverStream stream_create(int device, int priority) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    auto s = std::make_unique<CudaStreamObj>();
    s->device = device;
    check(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, priority),
          "cudaStreamCreateWithPriority");
    return reinterpret_cast<DriverStream>(s.release());
  }
  // Another library's stream (torch.cuda's, CuPy's, ...), checked to be a stream of `device`.
  DriverStream stream_adopt(int device, void* native, int* priority) override {
    auto s = std::make_unique<CudaStreamObj>();
    s->stream = static_cast<cudaStream_t>(native);
    s->device = device;
    s->owned = false;
    int on = -1;
    check(cudaStreamGetDevice(s->stream, &on), "cudaStreamGetDevice");
    if (on != device) {
      throw InvalidValueError("cuda driver: the stream belongs to CUDA device " +
                                  std::to_string(on) + ", not to device " + std::to_string(device),
                              __FILE__, __LINE__);
    }
    check(cudaStreamGetPriority(s->stream, priority), "cudaStreamGetPriority");
    return reinterpret_cast<DriverStream>(s.release());
  }
  void stream_destroy(DriverStream stream) override {
    std::unique_ptr<CudaStreamObj> s(as_stream(stream));
    if (!s->owned) return;  // its creator destroys it
    check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    check(cudaStreamDestroy(s->stream), "cudaStreamDestroy");
  }
  void* stream_native_handle(DriverStream stream) override { return as_stream(stream)->stream; }

  // Virtual memory (expandable segments) through the driver API's cuMem* (vmm.h).
  std::size_t va_granularity(int device) override { return vmm_.granularity(device); }
  void* va_reserve(int device, std::size_t size) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    return vmm_.reserve(size);
  }
  void va_release(int device, void* ptr, std::size_t size) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    vmm_.release(ptr, size);
  }
  bool va_map(int device, void* ptr, std::size_t size) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    return vmm_.map(device, ptr, size);
  }
  void va_unmap(int device, void* ptr, std::size_t size) override {
    // cuMemUnmap does not wait for kernels: the device's work finishes first (as cudaFree).
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    vmm_.unmap(ptr, size);
  }

  int64_t device_sensor(int device, Sensor sensor) override { return nvml_.read(device, sensor); }
  std::vector<DeviceProcess> device_processes(int device) override {
    return nvml_.processes(device);
  }

  void launch_host_func(DriverStream stream, Task task, const char*) override {
    CudaStreamObj* s = as_stream(stream);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture = 0;
    check(cudaStreamGetCaptureInfo(s->stream, &status, &capture), "cudaStreamGetCaptureInfo");
    const bool captured = status == cudaStreamCaptureStatusActive;
    auto payload =
        std::make_unique<HostPayload>(HostPayload{this, s->device, std::move(task), captured});
    HostPayload* raw = payload.get();
    // An eager payload is CUDA's once launched: it may have run and freed itself by the time
    // cudaLaunchHostFunc returns, so nothing of it is read after the launch.
    check(cudaLaunchHostFunc(s->stream, &CudaDriver::run_host_payload, raw), "cudaLaunchHostFunc");
    if (captured) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& list = captures_[capture];
      if (!list) list = std::make_shared<Payloads>();
      list->push_back(std::move(payload));
    } else {
      (void)payload.release();  // run_host_payload frees it
    }
  }

  void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind,
                    DriverStream stream) override {
    check(cudaMemcpyAsync(dst, src, size, to_cuda(kind), as_stream(stream)->stream),
          "cudaMemcpyAsync");
  }
  void memset_async(void* dst, int value, std::size_t size, DriverStream stream) override {
    check(cudaMemsetAsync(dst, value, size, as_stream(stream)->stream), "cudaMemsetAsync");
  }
  bool stream_query(DriverStream stream) override {
    return completed(cudaStreamQuery(as_stream(stream)->stream), "cudaStreamQuery");
  }
  void stream_synchronize(DriverStream stream) override {
    CudaStreamObj* s = as_stream(stream);
    check(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize");
    report_failure(s->device);
  }

  DriverEvent event_create(int device, bool timing) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    auto e = std::make_unique<CudaEventObj>();
    e->device = device;
    check(cudaEventCreateWithFlags(&e->event, timing ? cudaEventDefault : cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    return reinterpret_cast<DriverEvent>(e.release());
  }
  void event_destroy(DriverEvent event) override {
    std::unique_ptr<CudaEventObj> e(as_event(event));
    check(cudaEventDestroy(e->event), "cudaEventDestroy");
  }
  // Interprocess events: CUDA requires them without timing.
  DriverEvent event_create_ipc(int device) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    auto e = std::make_unique<CudaEventObj>();
    e->device = device;
    check(cudaEventCreateWithFlags(&e->event, cudaEventInterprocess | cudaEventDisableTiming),
          "cudaEventCreateWithFlags");
    return reinterpret_cast<DriverEvent>(e.release());
  }
  IpcEventHandle ipc_get_event_handle(DriverEvent event) override {
    cudaIpcEventHandle_t h{};
    check(cudaIpcGetEventHandle(&h, as_event(event)->event), "cudaIpcGetEventHandle");
    IpcEventHandle out;
    static_assert(sizeof(h) <= sizeof(out.bytes));
    std::memcpy(out.bytes, &h, sizeof(h));
    return out;
  }
  DriverEvent ipc_open_event_handle(int device, const IpcEventHandle& handle) override {
    check(cudaSetDevice(device), "cudaSetDevice");
    cudaIpcEventHandle_t h{};
    std::memcpy(&h, handle.bytes, sizeof(h));
    auto e = std::make_unique<CudaEventObj>();
    e->device = device;
    check(cudaIpcOpenEventHandle(&e->event, h), "cudaIpcOpenEventHandle");
    return reinterpret_cast<DriverEvent>(e.release());
  }
  void event_record(DriverEvent event, DriverStream stream) override {
    check(cudaEventRecord(as_event(event)->event, as_stream(stream)->stream), "cudaEventRecord");
  }
  void stream_wait_event(DriverStream stream, DriverEvent event) override {
    check(cudaStreamWaitEvent(as_stream(stream)->stream, as_event(event)->event, 0),
          "cudaStreamWaitEvent");
  }
  bool event_query(DriverEvent event) override {
    return completed(cudaEventQuery(as_event(event)->event), "cudaEventQuery");
  }
  void event_synchronize(DriverEvent event) override {
    CudaEventObj* e = as_event(event);
    check(cudaEventSynchronize(e->event), "cudaEventSynchronize");
    report_failure(e->device);
  }
  float event_elapsed_ms(DriverEvent start, DriverEvent end) override {
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, as_event(start)->event, as_event(end)->event),
          "cudaEventElapsedTime");
    return ms;
  }

  void stream_begin_capture(DriverStream stream, CaptureMode mode) override {
    check(cudaStreamBeginCapture(as_stream(stream)->stream, to_cuda(mode)),
          "cudaStreamBeginCapture");
  }
  DriverGraph stream_end_capture(DriverStream stream) override {
    CudaStreamObj* s = as_stream(stream);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture = 0;
    check(cudaStreamGetCaptureInfo(s->stream, &status, &capture), "cudaStreamGetCaptureInfo");
    std::shared_ptr<Payloads> payloads;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = captures_.find(capture);
      if (it != captures_.end()) {
        payloads = std::move(it->second);
        captures_.erase(it);
      }
    }
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(s->stream, &graph), "cudaStreamEndCapture");
    auto g = std::make_unique<CudaGraphObj>();
    g->graph = graph;
    g->payloads = payloads ? std::move(payloads) : std::make_shared<Payloads>();
    return reinterpret_cast<DriverGraph>(g.release());
  }
  std::size_t graph_node_count(DriverGraph graph) override {
    std::size_t n = 0;
    check(cudaGraphGetNodes(as_graph(graph)->graph, nullptr, &n), "cudaGraphGetNodes");
    return n;
  }
  DriverGraphExec graph_instantiate(DriverGraph graph) override {
    auto e = std::make_unique<CudaGraphExecObj>();
    check(cudaGraphInstantiate(&e->exec, as_graph(graph)->graph, 0), "cudaGraphInstantiate");
    e->payloads = as_graph(graph)->payloads;
    return reinterpret_cast<DriverGraphExec>(e.release());
  }
  void graph_launch(DriverGraphExec exec, DriverStream stream) override {
    check(cudaGraphLaunch(as_exec(exec)->exec, as_stream(stream)->stream), "cudaGraphLaunch");
  }
  void graph_destroy(DriverGraph graph) override {
    std::unique_ptr<CudaGraphObj> g(as_graph(graph));
    check(cudaGraphDestroy(g->graph), "cudaGraphDestroy");
  }
  void graph_exec_destroy(DriverGraphExec exec) override {
    std::unique_ptr<CudaGraphExecObj> e(as_exec(exec));
    check(cudaGraphExecDestroy(e->exec), "cudaGraphExecDestroy");
  }
  void graph_debug_dump(DriverGraph graph, const char* path) override {
    if (std::FILE* f = std::fopen(path, "w")) {  // CUDA would say only "operating system error"
      std::fclose(f);
    } else {
      throw InvalidValueError(
          std::string("graph_debug_dump: cannot write '") + path + "': " + std::strerror(errno),
          __FILE__, __LINE__);
    }
    check(cudaGraphDebugDotPrint(as_graph(graph)->graph, path, cudaGraphDebugDotFlagsVerbose),
          "cudaGraphDebugDotPrint");
  }
  CaptureMode thread_capture_mode_exchange(CaptureMode mode) override {
    cudaStreamCaptureMode m = to_cuda(mode);
    check(cudaThreadExchangeStreamCaptureMode(&m), "cudaThreadExchangeStreamCaptureMode");
    return from_cuda(m);
  }

  PointerAttributes pointer_attributes(const void* ptr) override {
    cudaPointerAttributes a{};
    check(cudaPointerGetAttributes(&a, ptr), "cudaPointerGetAttributes");
    switch (a.type) {
      case cudaMemoryTypeDevice: return {.type = MemoryType::Device, .device = a.device};
      case cudaMemoryTypeManaged: return {.type = MemoryType::Managed, .device = a.device};
      case cudaMemoryTypeHost: return {.type = MemoryType::Host};
      default: return {};
    }
  }

 private:
  // Runs on CUDA's host-callback thread: no CUDA call is allowed here, and none is made.
  static void CUDART_CB run_host_payload(void* data) {
    auto* p = static_cast<HostPayload*>(data);
    try {
      p->task();
    } catch (const std::exception& e) {
      p->driver->record_failure(p->device, e.what());
    } catch (...) {
      p->driver->record_failure(p->device, "a host task threw a non-standard exception");
    }
    if (!p->owned_by_capture) delete p;
  }

  void record_failure(int device, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failures_[device].empty()) failures_[device] = what;
  }

  void report_failure(int device) {
    std::string what;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      what.swap(failures_[device]);
    }
    if (!what.empty()) throw TaskError(what, __FILE__, __LINE__);
  }

  const int devices_;
  cuda::NvmlSensors nvml_;
  cuda::Vmm vmm_;
  bool vmm_ok_ = false;
  std::string vmm_why_;  // why there is no virtual memory
  std::mutex mutex_;
  std::vector<std::string> failures_;  // per device: the first host task failure not reported
  std::unordered_map<unsigned long long, std::shared_ptr<Payloads>> captures_;  // by capture id
};

}  // namespace
}  // namespace accel::rt

extern "C" __attribute__((visibility("default"))) int accel_driver_open(uint32_t abi_version,
                                                                        accel_driver_table* table,
                                                                        size_t table_size,
                                                                        char* error,
                                                                        size_t error_len) {
  if (!accel::rt::driver_abi_matches(abi_version, error, error_len)) return 1;
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    std::snprintf(error, error_len, "cudaGetDeviceCount failed: %s (%s)", cudaGetErrorName(e),
                  cudaGetErrorString(e));
    return 1;
  }
  if (devices == 0) {
    std::snprintf(error, error_len, "no CUDA device is present");
    return 1;
  }
  try {
    return accel::rt::export_driver(std::make_unique<accel::rt::CudaDriver>(devices), table,
                                    table_size, error, error_len);
  } catch (const std::exception& ex) {
    std::snprintf(error, error_len, "%s", ex.what());
    return 1;
  }
}

// The count before the runtime starts (driver_abi.h): NVML's, which leaves CUDA uninitialized
// in this process (cudaGetDeviceCount initializes it, and a child forked after that cannot use
// CUDA), with CUDA_VISIBLE_DEVICES applied; torch.cuda.device_count counts the same way. -1
// without NVML or for UUID lists: the runtime then asks the table (cudaGetDeviceCount).
extern "C" __attribute__((visibility("default"))) int accel_driver_count_devices() {
  accel::rt::cuda::NvmlApi nvml;
  std::string why;
  if (!nvml.open(why)) return -1;
  int result = -1;
  if (nvml.init() == 0) {
    unsigned int raw = 0;
    if (nvml.count(&raw) == 0) {
      result = accel::rt::cuda::visible_device_count(std::getenv("CUDA_VISIBLE_DEVICES"),
                                                     static_cast<int>(raw));
    }
    nvml.shutdown();
  }
  nvml.close();
  return result;
}
