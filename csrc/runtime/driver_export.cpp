// export_driver: the C table of runtime/driver_abi.h over a C++ Driver, inside a driver library.
#include "runtime/driver_export.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace accel::rt {
namespace {

struct Exported {
  std::unique_ptr<Driver> driver;
  std::string name;
};

thread_local std::string t_oom_hint;

Driver& drv(accel_driver* self) {
  return *reinterpret_cast<Exported*>(self)->driver;
}
DriverStream stream(accel_drv_stream s) {
  return reinterpret_cast<DriverStream>(s);
}
DriverEvent event(accel_drv_event e) {
  return reinterpret_cast<DriverEvent>(e);
}
DriverGraph graph(accel_drv_graph g) {
  return reinterpret_cast<DriverGraph>(g);
}

thread_local std::string t_last_error;

// Runs `f`, turning what it throws into a status and the thread's last error.
template <class F>
int guarded(F&& f) noexcept {
  try {
    f();
    return ACCEL_DRV_SUCCESS;
  } catch (const Error& e) {
    t_last_error = e.message();
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    t_last_error = "out of host memory";
    return ACCEL_DRV_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return ACCEL_DRV_DRIVER_ERROR;
  } catch (...) {
    t_last_error = "the driver threw something that is not a std::exception";
    return ACCEL_DRV_DRIVER_ERROR;
  }
}

// A host function of the C table as a Task: owns the payload, throws TaskError on failure.
class HostFunction {
 public:
  HostFunction(accel_drv_host_fn fn, void* payload, accel_drv_release_fn release) noexcept
      : fn_(fn), payload_(payload), release_(release) {}
  HostFunction(HostFunction&& other) noexcept
      : fn_(other.fn_),
        payload_(other.payload_),
        release_(std::exchange(other.release_, nullptr)) {}
  HostFunction(const HostFunction&) = delete;
  HostFunction& operator=(const HostFunction&) = delete;
  HostFunction& operator=(HostFunction&&) = delete;
  ~HostFunction() {
    if (release_ != nullptr) release_(payload_);
  }
  void operator()() const {
    char error[1024] = {0};
    if (fn_(payload_, error, sizeof(error)) != 0) {
      throw TaskError(error[0] != 0 ? error : "a host function failed without saying why", __FILE__,
                      __LINE__);
    }
  }

 private:
  accel_drv_host_fn fn_;
  void* payload_;
  accel_drv_release_fn release_;
};

void fill_entries(accel_driver_table& t) {
  t.destroy = [](accel_driver* self) { delete reinterpret_cast<Exported*>(self); };
  t.last_error = [](accel_driver*) { return t_last_error.c_str(); };
  t.device_count = [](accel_driver* s, int* out) {
    return guarded([&] { *out = drv(s).device_count(); });
  };
  t.device_properties = [](accel_driver* s, int device, accel_drv_device_properties* out) {
    return guarded([&] {
      const DeviceProperties p = drv(s).device_properties(device);
      *out = {};
      std::snprintf(out->name, sizeof(out->name), "%s", p.name.c_str());
      out->total_memory = p.total_memory;
      out->compute_units = p.compute_units;
      out->major = p.major;
      out->minor = p.minor;
      out->max_threads_per_compute_unit = p.max_threads_per_compute_unit;
      out->integrated = p.integrated ? 1 : 0;
      out->max_kernel_args = p.max_kernel_args;
      out->max_kernel_buffers = p.max_kernel_buffers;
    });
  };
  t.device_uuid = [](accel_driver* s, int device, uint8_t* out) {
    return guarded([&] {
      const DeviceProperties p = drv(s).device_properties(device);
      std::memcpy(out, p.uuid.data(), p.uuid.size());
    });
  };
  t.set_device = [](accel_driver* s, int device) {
    return guarded([&] { drv(s).set_device(device); });
  };
  t.mem_get_info = [](accel_driver* s, int device, accel_drv_memory_info* out) {
    return guarded([&] {
      const MemoryInfo m = drv(s).mem_get_info(device);
      *out = {m.free, m.total};
    });
  };
  t.raw_alloc = [](accel_driver* s, int device, size_t size, void** out) {
    return guarded([&] { *out = drv(s).raw_alloc(device, size); });
  };
  t.raw_free = [](accel_driver* s, int device, void* ptr, size_t size) {
    return guarded([&] { drv(s).raw_free(device, ptr, size); });
  };
  t.host_alloc = [](accel_driver* s, size_t size, void** out) {
    return guarded([&] { *out = drv(s).host_alloc(size); });
  };
  t.host_free = [](accel_driver* s, void* ptr, size_t size) {
    return guarded([&] { drv(s).host_free(ptr, size); });
  };
  t.stream_priority_range = [](accel_driver* s, int* least, int* greatest) {
    return guarded([&] { std::tie(*least, *greatest) = drv(s).stream_priority_range(); });
  };
  t.stream_create = [](accel_driver* s, int device, int priority, accel_drv_stream* out) {
    return guarded(
        [&] { *out = reinterpret_cast<accel_drv_stream>(drv(s).stream_create(device, priority)); });
  };
  t.stream_destroy = [](accel_driver* s, accel_drv_stream st) {
    return guarded([&] { drv(s).stream_destroy(stream(st)); });
  };
  t.launch_host_func = [](accel_driver* s, accel_drv_stream st, accel_drv_host_fn fn, void* payload,
                          accel_drv_release_fn release, const char* label) {
    HostFunction task(fn, payload, release);  // released here if submission fails
    return guarded([&] { drv(s).launch_host_func(stream(st), Task(std::move(task)), label); });
  };
  t.memcpy_async = [](accel_driver* s, void* dst, const void* src, size_t size, int kind,
                      accel_drv_stream st) {
    return guarded([&] {
      ACCEL_RT_CHECK(kind >= ACCEL_DRV_HOST_TO_HOST && kind <= ACCEL_DRV_DEVICE_TO_DEVICE,
                     InvalidValueError, "memcpy_async: unknown copy kind ", kind);
      drv(s).memcpy_async(dst, src, size, static_cast<CopyKind>(kind), stream(st));
    });
  };
  t.memset_async = [](accel_driver* s, void* dst, int value, size_t size, accel_drv_stream st) {
    return guarded([&] { drv(s).memset_async(dst, value, size, stream(st)); });
  };
  t.stream_query = [](accel_driver* s, accel_drv_stream st, int* done) {
    return guarded([&] { *done = drv(s).stream_query(stream(st)) ? 1 : 0; });
  };
  t.stream_synchronize = [](accel_driver* s, accel_drv_stream st) {
    return guarded([&] { drv(s).stream_synchronize(stream(st)); });
  };
  t.event_create = [](accel_driver* s, int device, int timing, accel_drv_event* out) {
    return guarded([&] {
      *out = reinterpret_cast<accel_drv_event>(drv(s).event_create(device, timing != 0));
    });
  };
  t.event_destroy = [](accel_driver* s, accel_drv_event e) {
    return guarded([&] { drv(s).event_destroy(event(e)); });
  };
  t.event_record = [](accel_driver* s, accel_drv_event e, accel_drv_stream st) {
    return guarded([&] { drv(s).event_record(event(e), stream(st)); });
  };
  t.stream_wait_event = [](accel_driver* s, accel_drv_stream st, accel_drv_event e) {
    return guarded([&] { drv(s).stream_wait_event(stream(st), event(e)); });
  };
  t.event_query = [](accel_driver* s, accel_drv_event e, int* done) {
    return guarded([&] { *done = drv(s).event_query(event(e)) ? 1 : 0; });
  };
  t.event_synchronize = [](accel_driver* s, accel_drv_event e) {
    return guarded([&] { drv(s).event_synchronize(event(e)); });
  };
  t.event_elapsed_ms = [](accel_driver* s, accel_drv_event a, accel_drv_event b, float* out) {
    return guarded([&] { *out = drv(s).event_elapsed_ms(event(a), event(b)); });
  };
  t.stream_begin_capture = [](accel_driver* s, accel_drv_stream st, int mode) {
    return guarded([&] {
      ACCEL_RT_CHECK(mode >= ACCEL_DRV_CAPTURE_GLOBAL && mode <= ACCEL_DRV_CAPTURE_RELAXED,
                     InvalidValueError, "stream_begin_capture: unknown capture mode ", mode);
      drv(s).stream_begin_capture(stream(st), static_cast<CaptureMode>(mode));
    });
  };
  t.stream_end_capture = [](accel_driver* s, accel_drv_stream st, accel_drv_graph* out) {
    return guarded(
        [&] { *out = reinterpret_cast<accel_drv_graph>(drv(s).stream_end_capture(stream(st))); });
  };
  t.graph_node_count = [](accel_driver* s, accel_drv_graph g, size_t* out) {
    return guarded([&] { *out = drv(s).graph_node_count(graph(g)); });
  };
  t.graph_instantiate = [](accel_driver* s, accel_drv_graph g, accel_drv_graph_exec* out) {
    return guarded(
        [&] { *out = reinterpret_cast<accel_drv_graph_exec>(drv(s).graph_instantiate(graph(g))); });
  };
  t.graph_launch = [](accel_driver* s, accel_drv_graph_exec x, accel_drv_stream st) {
    return guarded([&] { drv(s).graph_launch(reinterpret_cast<DriverGraphExec>(x), stream(st)); });
  };
  t.graph_destroy = [](accel_driver* s, accel_drv_graph g) {
    return guarded([&] { drv(s).graph_destroy(graph(g)); });
  };
  t.graph_exec_destroy = [](accel_driver* s, accel_drv_graph_exec x) {
    return guarded([&] { drv(s).graph_exec_destroy(reinterpret_cast<DriverGraphExec>(x)); });
  };
  t.host_access_begin = [](accel_driver* s, int device, const void* ptr, size_t size) {
    return guarded([&] { drv(s).host_access_begin(device, ptr, size); });
  };
  t.host_access_end = [](accel_driver* s, int device, const void* ptr, size_t size) {
    return guarded([&] { drv(s).host_access_end(device, ptr, size); });
  };
  t.stream_native_handle = [](accel_driver* s, accel_drv_stream st, void** out) {
    return guarded([&] { *out = drv(s).stream_native_handle(stream(st)); });
  };
  t.graph_debug_dump = [](accel_driver* s, accel_drv_graph g, const char* path) {
    return guarded([&] { drv(s).graph_debug_dump(graph(g), path); });
  };
  t.thread_capture_mode_exchange = [](accel_driver* s, int mode, int* previous) {
    return guarded([&] {
      ACCEL_RT_CHECK(mode >= ACCEL_DRV_CAPTURE_GLOBAL && mode <= ACCEL_DRV_CAPTURE_RELAXED,
                     InvalidValueError, "thread_capture_mode_exchange: unknown mode ", mode);
      *previous =
          static_cast<int>(drv(s).thread_capture_mode_exchange(static_cast<CaptureMode>(mode)));
    });
  };
  t.oom_hint = [](accel_driver* s) -> const char* {
    try {
      t_oom_hint = drv(s).oom_hint();
    } catch (...) {
      t_oom_hint.clear();
    }
    return t_oom_hint.c_str();
  };
  t.stream_adopt = [](accel_driver* s, int device, void* native, accel_drv_stream* out,
                      int* priority) {
    return guarded([&] {
      *out = reinterpret_cast<accel_drv_stream>(drv(s).stream_adopt(device, native, priority));
    });
  };
  t.device_sensor = [](accel_driver* s, int device, int sensor, int64_t* out) {
    return guarded([&] {
      ACCEL_RT_CHECK(
          sensor >= ACCEL_DRV_SENSOR_UTILIZATION && sensor <= ACCEL_DRV_SENSOR_MEMORY_USED,
          InvalidValueError, "device_sensor: unknown sensor ", sensor);
      *out = drv(s).device_sensor(device, static_cast<Sensor>(sensor));
    });
  };
  t.device_processes = [](accel_driver* s, int device, accel_drv_process* out, size_t capacity,
                          size_t* count) {
    return guarded([&] {
      const std::vector<DeviceProcess> found = drv(s).device_processes(device);
      *count = found.size();
      for (std::size_t i = 0; i < found.size() && i < capacity; ++i) {
        out[i] = {found[i].pid, found[i].memory};
      }
    });
  };
  t.va_granularity = [](accel_driver* s, int device, size_t* out) {
    return guarded([&] { *out = drv(s).va_granularity(device); });
  };
  t.va_reserve = [](accel_driver* s, int device, size_t size, void** out) {
    return guarded([&] { *out = drv(s).va_reserve(device, size); });
  };
  t.va_release = [](accel_driver* s, int device, void* ptr, size_t size) {
    return guarded([&] { drv(s).va_release(device, ptr, size); });
  };
  t.va_map = [](accel_driver* s, int device, void* ptr, size_t size, int* mapped) {
    return guarded([&] { *mapped = drv(s).va_map(device, ptr, size) ? 1 : 0; });
  };
  t.va_unmap = [](accel_driver* s, int device, void* ptr, size_t size) {
    return guarded([&] { drv(s).va_unmap(device, ptr, size); });
  };
  t.ipc_get_mem_handle = [](accel_driver* s, int device, void* base, size_t size,
                            accel_drv_ipc_handle* out) {
    return guarded([&] {
      const IpcMemHandle h = drv(s).ipc_get_mem_handle(device, base, size);
      std::memcpy(out->bytes, h.bytes, sizeof(out->bytes));
    });
  };
  t.ipc_open_mem_handle = [](accel_driver* s, int device, const accel_drv_ipc_handle* handle,
                             void** out, size_t* size) {
    return guarded([&] {
      IpcMemHandle h;
      std::memcpy(h.bytes, handle->bytes, sizeof(h.bytes));
      *out = drv(s).ipc_open_mem_handle(device, h, size);
    });
  };
  t.ipc_close_mem_handle = [](accel_driver* s, int device, void* ptr) {
    return guarded([&] { drv(s).ipc_close_mem_handle(device, ptr); });
  };
  t.event_create_ipc = [](accel_driver* s, int device, accel_drv_event* out) {
    return guarded(
        [&] { *out = reinterpret_cast<accel_drv_event>(drv(s).event_create_ipc(device)); });
  };
  t.ipc_get_event_handle = [](accel_driver* s, accel_drv_event e, accel_drv_ipc_handle* out) {
    return guarded([&] {
      const IpcEventHandle h = drv(s).ipc_get_event_handle(event(e));
      std::memcpy(out->bytes, h.bytes, sizeof(out->bytes));
    });
  };
  t.ipc_open_event_handle = [](accel_driver* s, int device, const accel_drv_ipc_handle* handle,
                               accel_drv_event* out) {
    return guarded([&] {
      IpcEventHandle h;
      std::memcpy(h.bytes, handle->bytes, sizeof(h.bytes));
      *out = reinterpret_cast<accel_drv_event>(drv(s).ipc_open_event_handle(device, h));
    });
  };
  t.pointer_attributes = [](accel_driver* s, const void* ptr, accel_drv_pointer_attributes* out) {
    return guarded([&] {
      const PointerAttributes a = drv(s).pointer_attributes(ptr);
      *out = {static_cast<int32_t>(a.type), a.device};
    });
  };
}

}  // namespace

bool driver_abi_matches(uint32_t abi_version, char* error, std::size_t error_len) {
  if (abi_version == ACCEL_DRIVER_ABI_VERSION) return true;
  std::snprintf(error, error_len, "built for driver ABI %d, the runtime has %u",
                ACCEL_DRIVER_ABI_VERSION, abi_version);
  return false;
}

int export_driver(std::unique_ptr<Driver> driver, accel_driver_table* table, std::size_t table_size,
                  char* error, std::size_t error_len) {
  if (!driver || table == nullptr) {
    std::snprintf(error, error_len, "export_driver: no driver or no table");
    return 1;
  }
  accel_driver_table t{};
  t.abi_version = ACCEL_DRIVER_ABI_VERSION;
  const DriverCapabilities c = driver->capabilities();
  t.capabilities = {c.graphs, c.host_functions, c.timing_events, c.host_accessible_memory,
                    c.native_handles};
  auto* exported = new Exported{std::move(driver), {}};
  exported->name = std::string(exported->driver->name());
  t.self = reinterpret_cast<accel_driver*>(exported);
  t.name = exported->name.c_str();
  fill_entries(t);
  if (!c.virtual_memory) {  // absent entries say "no virtual memory"
    t.va_granularity = nullptr;
    t.va_reserve = nullptr;
    t.va_release = nullptr;
    t.va_map = nullptr;
    t.va_unmap = nullptr;
  }
  if (!c.ipc_memory) {  // absent entries say "no interprocess memory"
    t.ipc_get_mem_handle = nullptr;
    t.ipc_open_mem_handle = nullptr;
    t.ipc_close_mem_handle = nullptr;
  }
  if (!c.ipc_events) {  // absent entries say "no interprocess events"
    t.event_create_ipc = nullptr;
    t.ipc_get_event_handle = nullptr;
    t.ipc_open_event_handle = nullptr;
  }
  t.struct_size = static_cast<uint32_t>(std::min(table_size, sizeof(t)));
  std::memcpy(static_cast<void*>(table), &t, t.struct_size);
  return 0;
}

}  // namespace accel::rt
