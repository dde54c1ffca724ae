// The runtime's side of the driver library ABI (runtime/driver_abi.h): a Driver over the C
// table a library filled, with the typed errors and the sticky device-lost state.
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/driver_abi.h"
#include "runtime/internal.h"

namespace accel::rt::detail {
namespace {

static_assert(ACCEL_DRV_DRIVER_ERROR == static_cast<int>(ErrorCode::DriverError) &&
                  ACCEL_DRV_DEVICE_LOST == static_cast<int>(ErrorCode::DeviceLost) &&
                  ACCEL_DRV_CAPTURE_UNJOINED == static_cast<int>(ErrorCode::CaptureUnjoined),
              "accel_drv_status follows ErrorCode");
static_assert(ACCEL_DRV_DEVICE_TO_DEVICE == static_cast<int>(CopyKind::DeviceToDevice) &&
                  ACCEL_DRV_CAPTURE_RELAXED == static_cast<int>(CaptureMode::Relaxed) &&
                  ACCEL_DRV_MEMORY_MANAGED == static_cast<int>(MemoryType::Managed) &&
                  ACCEL_DRV_SENSOR_MEMORY_USED == static_cast<int>(Sensor::MemoryUsed),
              "the C enums follow the runtime's");

// The host function the runtime hands to drivers: its payload is a heap Task.
int run_task(void* payload, char* error, std::size_t error_len) {
  try {
    (*static_cast<Task*>(payload))();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
  } catch (...) {
    std::snprintf(error, error_len, "a host task threw something that is not a std::exception");
  }
  return 1;
}
void release_task(void* payload) {
  delete static_cast<Task*>(payload);
}

accel_drv_stream cs(DriverStream s) {
  return reinterpret_cast<accel_drv_stream>(s);
}
accel_drv_event ce(DriverEvent e) {
  return reinterpret_cast<accel_drv_event>(e);
}
accel_drv_graph cg(DriverGraph g) {
  return reinterpret_cast<accel_drv_graph>(g);
}

class TableDriver final : public Driver {
 public:
  explicit TableDriver(const accel_driver_table& t) : t_(t), name_(t.name) {}
  ~TableDriver() override { t_.destroy(t_.self); }

  std::string_view name() const override { return name_; }
  DriverCapabilities capabilities() const override {
    const accel_drv_capabilities& c = t_.capabilities;
    return {.graphs = c.graphs != 0,
            .host_functions = c.host_functions != 0,
            .timing_events = c.timing_events != 0,
            .host_accessible_memory = c.host_accessible_memory != 0,
            .native_handles = c.native_handles != 0 && t_.stream_native_handle != nullptr,
            .virtual_memory = t_.va_granularity != nullptr && t_.va_reserve != nullptr &&
                              t_.va_release != nullptr && t_.va_map != nullptr &&
                              t_.va_unmap != nullptr,
            .ipc_memory = t_.ipc_get_mem_handle != nullptr && t_.ipc_open_mem_handle != nullptr &&
                          t_.ipc_close_mem_handle != nullptr,
            .ipc_events = t_.event_create_ipc != nullptr && t_.ipc_get_event_handle != nullptr &&
                          t_.ipc_open_event_handle != nullptr};
  }

  int device_count() override {
    int n = 0;
    run("device_count", [&] { return t_.device_count(t_.self, &n); });
    return n;
  }
  DeviceProperties device_properties(int device) override {
    accel_drv_device_properties p{};
    run("device_properties", [&] { return t_.device_properties(t_.self, device, &p); });
    p.name[sizeof(p.name) - 1] = 0;
    std::array<uint8_t, 16> uuid{};
    if (t_.device_uuid != nullptr) {
      run("device_uuid", [&] { return t_.device_uuid(t_.self, device, uuid.data()); });
    }
    return {.name = p.name,
            .driver = name_,
            .total_memory = p.total_memory,
            .compute_units = p.compute_units,
            .major = p.major,
            .minor = p.minor,
            .max_threads_per_compute_unit = p.max_threads_per_compute_unit,
            .integrated = p.integrated != 0,
            .max_kernel_args = p.max_kernel_args,
            .max_kernel_buffers = p.max_kernel_buffers,
            .uuid = uuid};
  }
  void set_device(int device) override {
    run("set_device", [&] { return t_.set_device(t_.self, device); });
  }
  MemoryInfo mem_get_info(int device) override {
    accel_drv_memory_info m{};
    run("mem_get_info", [&] { return t_.mem_get_info(t_.self, device, &m); });
    return {m.free, m.total};
  }

  void* raw_alloc(int device, std::size_t size) override {
    void* p = nullptr;
    run("raw_alloc", [&] { return t_.raw_alloc(t_.self, device, size, &p); });
    return p;
  }
  void raw_free(int device, void* ptr, std::size_t size) override {
    if (!lost()) run("raw_free", [&] { return t_.raw_free(t_.self, device, ptr, size); });
  }
  void* host_alloc(std::size_t size) override {
    void* p = nullptr;
    run("host_alloc", [&] { return t_.host_alloc(t_.self, size, &p); });
    return p;
  }
  void host_free(void* ptr, std::size_t size) override {
    if (!lost()) run("host_free", [&] { return t_.host_free(t_.self, ptr, size); });
  }
  void host_access_begin(int device, const void* ptr, std::size_t size) override {
    if (t_.host_access_begin != nullptr) {
      run("host_access_begin", [&] { return t_.host_access_begin(t_.self, device, ptr, size); });
    }
  }
  void host_access_end(int device, const void* ptr, std::size_t size) override {
    if (t_.host_access_end != nullptr && !lost()) {
      run("host_access_end", [&] { return t_.host_access_end(t_.self, device, ptr, size); });
    }
  }

  std::pair<int, int> stream_priority_range() override {
    int least = 0, greatest = 0;
    run("stream_priority_range",
        [&] { return t_.stream_priority_range(t_.self, &least, &greatest); });
    return {least, greatest};
  }
  DriverStream stream_create(int device, int priority) override {
    accel_drv_stream s = nullptr;
    run("stream_create", [&] { return t_.stream_create(t_.self, device, priority, &s); });
    return reinterpret_cast<DriverStream>(s);
  }
  void stream_destroy(DriverStream stream) override {
    if (!lost()) run("stream_destroy", [&] { return t_.stream_destroy(t_.self, cs(stream)); });
  }
  void* stream_native_handle(DriverStream stream) override {
    if (t_.stream_native_handle == nullptr) return nullptr;
    void* h = nullptr;
    run("stream_native_handle", [&] { return t_.stream_native_handle(t_.self, cs(stream), &h); });
    return h;
  }
  void launch_host_func(DriverStream stream, Task task, const char* label) override {
    // The driver releases the payload exactly once, also when submission fails.
    run("launch_host_func", [&] {
      return t_.launch_host_func(t_.self, cs(stream), &run_task, new Task(std::move(task)),
                                 &release_task, label);
    });
  }
  void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind,
                    DriverStream stream) override {
    run("memcpy_async", [&] {
      return t_.memcpy_async(t_.self, dst, src, size, static_cast<int>(kind), cs(stream));
    });
  }
  void memset_async(void* dst, int value, std::size_t size, DriverStream stream) override {
    run("memset_async", [&] { return t_.memset_async(t_.self, dst, value, size, cs(stream)); });
  }
  bool stream_query(DriverStream stream) override {
    int done = 0;
    run("stream_query", [&] { return t_.stream_query(t_.self, cs(stream), &done); });
    return done != 0;
  }
  void stream_synchronize(DriverStream stream) override {
    run("stream_synchronize", [&] { return t_.stream_synchronize(t_.self, cs(stream)); });
  }

  DriverEvent event_create(int device, bool timing) override {
    accel_drv_event e = nullptr;
    run("event_create", [&] { return t_.event_create(t_.self, device, timing ? 1 : 0, &e); });
    return reinterpret_cast<DriverEvent>(e);
  }
  void event_destroy(DriverEvent event) override {
    if (!lost()) run("event_destroy", [&] { return t_.event_destroy(t_.self, ce(event)); });
  }
  void event_record(DriverEvent event, DriverStream stream) override {
    run("event_record", [&] { return t_.event_record(t_.self, ce(event), cs(stream)); });
  }
  void stream_wait_event(DriverStream stream, DriverEvent event) override {
    run("stream_wait_event", [&] { return t_.stream_wait_event(t_.self, cs(stream), ce(event)); });
  }
  bool event_query(DriverEvent event) override {
    int done = 0;
    run("event_query", [&] { return t_.event_query(t_.self, ce(event), &done); });
    return done != 0;
  }
  void event_synchronize(DriverEvent event) override {
    run("event_synchronize", [&] { return t_.event_synchronize(t_.self, ce(event)); });
  }
  float event_elapsed_ms(DriverEvent start, DriverEvent end) override {
    float ms = 0;
    run("event_elapsed_ms", [&] { return t_.event_elapsed_ms(t_.self, ce(start), ce(end), &ms); });
    return ms;
  }

  void stream_begin_capture(DriverStream stream, CaptureMode mode) override {
    run("stream_begin_capture",
        [&] { return t_.stream_begin_capture(t_.self, cs(stream), static_cast<int>(mode)); });
  }
  DriverGraph stream_end_capture(DriverStream stream) override {
    accel_drv_graph g = nullptr;
    run("stream_end_capture", [&] { return t_.stream_end_capture(t_.self, cs(stream), &g); });
    return reinterpret_cast<DriverGraph>(g);
  }
  std::size_t graph_node_count(DriverGraph graph) override {
    std::size_t n = 0;
    run("graph_node_count", [&] { return t_.graph_node_count(t_.self, cg(graph), &n); });
    return n;
  }
  DriverGraphExec graph_instantiate(DriverGraph graph) override {
    accel_drv_graph_exec x = nullptr;
    run("graph_instantiate", [&] { return t_.graph_instantiate(t_.self, cg(graph), &x); });
    return reinterpret_cast<DriverGraphExec>(x);
  }
  void graph_launch(DriverGraphExec exec, DriverStream stream) override {
    run("graph_launch", [&] {
      return t_.graph_launch(t_.self, reinterpret_cast<accel_drv_graph_exec>(exec), cs(stream));
    });
  }
  void graph_destroy(DriverGraph graph) override {
    if (!lost()) run("graph_destroy", [&] { return t_.graph_destroy(t_.self, cg(graph)); });
  }
  void graph_exec_destroy(DriverGraphExec exec) override {
    if (!lost()) {
      run("graph_exec_destroy", [&] {
        return t_.graph_exec_destroy(t_.self, reinterpret_cast<accel_drv_graph_exec>(exec));
      });
    }
  }
  void graph_debug_dump(DriverGraph graph, const char* path) override {
    if (t_.graph_debug_dump == nullptr) return Driver::graph_debug_dump(graph, path);
    run("graph_debug_dump", [&] { return t_.graph_debug_dump(t_.self, cg(graph), path); });
  }
  CaptureMode thread_capture_mode_exchange(CaptureMode mode) override {
    if (t_.thread_capture_mode_exchange == nullptr || lost()) return mode;
    int previous = 0;
    run("thread_capture_mode_exchange", [&] {
      return t_.thread_capture_mode_exchange(t_.self, static_cast<int>(mode), &previous);
    });
    return static_cast<CaptureMode>(previous);
  }
  std::string oom_hint() const override {
    const char* h = t_.oom_hint != nullptr ? t_.oom_hint(t_.self) : nullptr;
    return h != nullptr ? std::string(h) : std::string();
  }
  PointerAttributes pointer_attributes(const void* ptr) override {
    if (t_.pointer_attributes == nullptr) return {};
    accel_drv_pointer_attributes a{};
    run("pointer_attributes", [&] { return t_.pointer_attributes(t_.self, ptr, &a); });
    ACCEL_RT_CHECK(a.type >= ACCEL_DRV_MEMORY_UNREGISTERED && a.type <= ACCEL_DRV_MEMORY_MANAGED,
                   DriverError, "the ", name_, " driver's pointer_attributes(", format_ptr(ptr),
                   ") returned the unknown memory type ", a.type);
    return {.type = static_cast<MemoryType>(a.type), .device = a.device};
  }
  DriverStream stream_adopt(int device, void* native, int* priority) override {
    if (t_.stream_adopt == nullptr) return Driver::stream_adopt(device, native, priority);
    accel_drv_stream st = nullptr;
    run("stream_adopt", [&] { return t_.stream_adopt(t_.self, device, native, &st, priority); });
    return reinterpret_cast<DriverStream>(st);
  }
  std::size_t va_granularity(int device) override {
    if (!capabilities().virtual_memory) return Driver::va_granularity(device);
    std::size_t g = 0;
    run("va_granularity", [&] { return t_.va_granularity(t_.self, device, &g); });
    return g;
  }
  void* va_reserve(int device, std::size_t size) override {
    if (!capabilities().virtual_memory) return Driver::va_reserve(device, size);
    void* p = nullptr;
    run("va_reserve", [&] { return t_.va_reserve(t_.self, device, size, &p); });
    return p;
  }
  void va_release(int device, void* ptr, std::size_t size) override {
    if (!capabilities().virtual_memory) return Driver::va_release(device, ptr, size);
    if (!lost()) run("va_release", [&] { return t_.va_release(t_.self, device, ptr, size); });
  }
  bool va_map(int device, void* ptr, std::size_t size) override {
    if (!capabilities().virtual_memory) return Driver::va_map(device, ptr, size);
    int mapped = 0;
    run("va_map", [&] { return t_.va_map(t_.self, device, ptr, size, &mapped); });
    return mapped != 0;
  }
  void va_unmap(int device, void* ptr, std::size_t size) override {
    if (!capabilities().virtual_memory) return Driver::va_unmap(device, ptr, size);
    if (!lost()) run("va_unmap", [&] { return t_.va_unmap(t_.self, device, ptr, size); });
  }
  IpcMemHandle ipc_get_mem_handle(int device, void* base, std::size_t size) override {
    if (!capabilities().ipc_memory) return Driver::ipc_get_mem_handle(device, base, size);
    accel_drv_ipc_handle h{};
    run("ipc_get_mem_handle",
        [&] { return t_.ipc_get_mem_handle(t_.self, device, base, size, &h); });
    IpcMemHandle out;
    static_assert(sizeof(out.bytes) == sizeof(h.bytes));
    std::memcpy(out.bytes, h.bytes, sizeof(out.bytes));
    return out;
  }
  void* ipc_open_mem_handle(int device, const IpcMemHandle& handle, std::size_t* size) override {
    if (!capabilities().ipc_memory) return Driver::ipc_open_mem_handle(device, handle, size);
    accel_drv_ipc_handle h{};
    std::memcpy(h.bytes, handle.bytes, sizeof(h.bytes));
    void* p = nullptr;
    run("ipc_open_mem_handle",
        [&] { return t_.ipc_open_mem_handle(t_.self, device, &h, &p, size); });
    return p;
  }
  void ipc_close_mem_handle(int device, void* ptr) override {
    if (!capabilities().ipc_memory) return Driver::ipc_close_mem_handle(device, ptr);
    if (!lost()) {
      run("ipc_close_mem_handle", [&] { return t_.ipc_close_mem_handle(t_.self, device, ptr); });
    }
  }
  DriverEvent event_create_ipc(int device) override {
    if (!capabilities().ipc_events) return Driver::event_create_ipc(device);
    accel_drv_event e = nullptr;
    run("event_create_ipc", [&] { return t_.event_create_ipc(t_.self, device, &e); });
    return reinterpret_cast<DriverEvent>(e);
  }
  IpcEventHandle ipc_get_event_handle(DriverEvent event) override {
    if (!capabilities().ipc_events) return Driver::ipc_get_event_handle(event);
    accel_drv_ipc_handle h{};
    run("ipc_get_event_handle", [&] { return t_.ipc_get_event_handle(t_.self, ce(event), &h); });
    IpcEventHandle out;
    static_assert(sizeof(out.bytes) == sizeof(h.bytes));
    std::memcpy(out.bytes, h.bytes, sizeof(out.bytes));
    return out;
  }
  DriverEvent ipc_open_event_handle(int device, const IpcEventHandle& handle) override {
    if (!capabilities().ipc_events) return Driver::ipc_open_event_handle(device, handle);
    accel_drv_ipc_handle h{};
    std::memcpy(h.bytes, handle.bytes, sizeof(h.bytes));
    accel_drv_event e = nullptr;
    run("ipc_open_event_handle", [&] { return t_.ipc_open_event_handle(t_.self, device, &h, &e); });
    return reinterpret_cast<DriverEvent>(e);
  }
  int64_t device_sensor(int device, Sensor sensor) override {
    if (t_.device_sensor == nullptr) return Driver::device_sensor(device, sensor);
    int64_t value = 0;
    run("device_sensor",
        [&] { return t_.device_sensor(t_.self, device, static_cast<int>(sensor), &value); });
    return value;
  }
  std::vector<DeviceProcess> device_processes(int device) override {
    if (t_.device_processes == nullptr) return Driver::device_processes(device);
    std::vector<accel_drv_process> found(8);
    for (;;) {
      std::size_t count = 0;
      run("device_processes",
          [&] { return t_.device_processes(t_.self, device, found.data(), found.size(), &count); });
      if (count <= found.size()) {
        std::vector<DeviceProcess> out;
        for (std::size_t i = 0; i < count; ++i) out.push_back({found[i].pid, found[i].memory});
        return out;
      }
      found.resize(count);  // more appeared than there was room for: ask again
    }
  }

 private:
  bool lost() const { return lost_.load(std::memory_order_acquire); }

  void throw_if_lost(const char* what) {
    if (__builtin_expect(lost(), 0)) {
      ACCEL_RT_THROW(DeviceLostError, what, ": the ", name_, " driver lost the device earlier (",
                     lost_message_, "); nothing more can run on it in this process");
    }
  }

  // Calls the driver and checks the status. Once the device is lost every call is refused
  // with the first loss before it reaches the driver (sticky, as CUDA's context errors are).
  template <class F>
  void run(const char* what, F&& entry) {
    throw_if_lost(what);
    const int status = entry();
    if (__builtin_expect(status != ACCEL_DRV_SUCCESS, 0)) {
      throw_if_lost(what);  // lost meanwhile, by another thread
      fail(status, what);
    }
  }

  [[noreturn]] void fail(int status, const char* what) {
    const char* m = t_.last_error(t_.self);
    std::string message = m != nullptr && m[0] != 0 ? m : "";
    if (status < 0 || status > ACCEL_DRV_DEVICE_LOST) {
      ACCEL_RT_THROW(DriverError, "the ", name_, " driver's ", what,
                     " returned the unknown status ", status, message.empty() ? "" : ": ", message);
    }
    const auto code = static_cast<ErrorCode>(status);
    if (message.empty()) message = concat(what, " failed (", error_code_name(code), ")");
    if (code == ErrorCode::DeviceLost) {
      std::call_once(lost_once_, [&] {
        lost_message_ = message;
        lost_.store(true, std::memory_order_release);
      });
      ACCEL_RT_THROW(DeviceLostError, "the ", name_, " driver lost the device: ", message,
                     ". Its context cannot be used again: every later call fails; restart the "
                     "process");
    }
    throw_error_code(code, std::move(message), __FILE__, __LINE__);
  }

  accel_driver_table t_;
  std::string name_;
  std::atomic<bool> lost_{false};
  std::once_flag lost_once_;
  std::string lost_message_;  // written once, before lost_ is set
};

// The entries every driver fills (graph entries only when it has graphs).
const char* missing_entry(const accel_driver_table& t) {
#define ACCEL_REQUIRE(entry) \
  if (t.entry == nullptr) return #entry
  ACCEL_REQUIRE(destroy);
  ACCEL_REQUIRE(last_error);
  ACCEL_REQUIRE(device_count);
  ACCEL_REQUIRE(device_properties);
  ACCEL_REQUIRE(set_device);
  ACCEL_REQUIRE(mem_get_info);
  ACCEL_REQUIRE(raw_alloc);
  ACCEL_REQUIRE(raw_free);
  ACCEL_REQUIRE(host_alloc);
  ACCEL_REQUIRE(host_free);
  ACCEL_REQUIRE(stream_priority_range);
  ACCEL_REQUIRE(stream_create);
  ACCEL_REQUIRE(stream_destroy);
  ACCEL_REQUIRE(launch_host_func);
  ACCEL_REQUIRE(memcpy_async);
  ACCEL_REQUIRE(memset_async);
  ACCEL_REQUIRE(stream_query);
  ACCEL_REQUIRE(stream_synchronize);
  ACCEL_REQUIRE(event_create);
  ACCEL_REQUIRE(event_destroy);
  ACCEL_REQUIRE(event_record);
  ACCEL_REQUIRE(stream_wait_event);
  ACCEL_REQUIRE(event_query);
  ACCEL_REQUIRE(event_synchronize);
  ACCEL_REQUIRE(event_elapsed_ms);
  if (t.capabilities.graphs != 0) {
    ACCEL_REQUIRE(stream_begin_capture);
    ACCEL_REQUIRE(stream_end_capture);
    ACCEL_REQUIRE(graph_node_count);
    ACCEL_REQUIRE(graph_instantiate);
    ACCEL_REQUIRE(graph_launch);
    ACCEL_REQUIRE(graph_destroy);
    ACCEL_REQUIRE(graph_exec_destroy);
  }
#undef ACCEL_REQUIRE
  return nullptr;
}

}  // namespace

std::unique_ptr<Driver> open_driver_table(void* open_symbol, const std::string& library,
                                          std::string& why) {
  const auto open = reinterpret_cast<accel_driver_open_fn>(open_symbol);
  accel_driver_table t{};
  char error[512] = {0};
  if (open(ACCEL_DRIVER_ABI_VERSION, &t, sizeof(t), error, sizeof(error)) != 0) {
    why = error[0] != 0 ? std::string(error) : "the driver refused to start";
    return nullptr;
  }
  // What the library did not fill (an older, shorter table) is absent.
  if (t.struct_size < sizeof(t)) {
    std::memset(reinterpret_cast<char*>(&t) + t.struct_size, 0, sizeof(t) - t.struct_size);
  }
  const auto refuse = [&](std::string reason) -> std::unique_ptr<Driver> {
    if (t.destroy != nullptr) t.destroy(t.self);
    why = library + ": " + std::move(reason);
    return nullptr;
  };
  if (t.abi_version != ACCEL_DRIVER_ABI_VERSION) {
    return refuse(concat("its table is for driver ABI ", t.abi_version, ", the runtime has ",
                         ACCEL_DRIVER_ABI_VERSION));
  }
  if (t.name == nullptr || t.name[0] == 0) return refuse("its table has no name");
  if (const char* entry = missing_entry(t)) {
    return refuse(concat("its table lacks the required entry ", entry));
  }
  return std::make_unique<TableDriver>(t);
}

}  // namespace accel::rt::detail
