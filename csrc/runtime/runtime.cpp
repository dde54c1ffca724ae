// Runtime start-up, driver selection, handle validation and devices (configuration:
// config.cpp; streams and events: streams.cpp; capture rules: capture.cpp).
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "runtime/caching_allocator.h"
#include "runtime/driver_abi.h"
#include "runtime/internal.h"

#ifndef ACCEL_VERSION
#define ACCEL_VERSION "0.0.0"
#endif

namespace accel::rt {
namespace detail {

// --- driver selection ---------------------------------------------------------------------

namespace {

std::string runtime_library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&runtime_library_dir), &info) == 0 ||
      info.dli_fname == nullptr) {
    return ".";
  }
  std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Loads libaccel_driver_<name>.so. Returns nullptr and sets `why` when it cannot.
void* open_plugin_library(const Config& c, const std::string& name, std::string& path,
                          std::string& why) {
  const std::string dir = c.driver_path.empty() ? runtime_library_dir() : c.driver_path;
  path = dir + "/libaccel_driver_" + name + ".so";
  if (!file_exists(path)) {
    why = path + " does not exist (this build has no " + name + " driver)";
    return nullptr;
  }
  // RTLD_NODELETE: a driver that refused to start is closed but stays mapped. Vendor runtimes
  // linked into it (cudart_static) register exit handlers and thread-local destructors that
  // would otherwise point into unmapped code at exit (ThreadSanitizer's exit handling crashed
  // there).
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (h == nullptr) {
    const char* e = ::dlerror();
    why = "dlopen(" + path + ") failed: " + (e != nullptr ? e : "unknown error");
  }
  return h;
}

// Opens the driver table of library `h` (loaded from `path`). Returns nullptr and sets `why`
// when it cannot.
std::unique_ptr<Driver> open_plugin_table(void* h, const std::string& path, std::string& why) {
  void* open = ::dlsym(h, "accel_driver_open");
  if (open == nullptr) {
    why = path + " does not export accel_driver_open (a driver built for an older runtime?)";
    ::dlclose(h);
    return nullptr;
  }
  std::unique_ptr<Driver> d = open_driver_table(open, path, why);
  if (d == nullptr) ::dlclose(h);
  return d;  // the library stays loaded for the life of the process
}

// Loads libaccel_driver_<name>.so and opens its driver table. Returns nullptr and sets `why`
// when it cannot.
std::unique_ptr<Driver> load_plugin(const Config& c, const std::string& name, std::string& why) {
  std::string path;
  void* h = open_plugin_library(c, name, path, why);
  return h != nullptr ? open_plugin_table(h, path, why) : nullptr;
}

// The devices driver `name` has, counted without opening its table where the library can
// (ACCEL_DRIVER_COUNT_SYMBOL: a count that initializes nothing, so a later fork() can still
// use the device, as NVML's count does for torch.cuda); else the table's count. 0 when the
// driver cannot be used.
int count_plugin_devices(const Config& c, const std::string& name) {
  std::string path;
  std::string why;
  void* h = open_plugin_library(c, name, path, why);
  if (h == nullptr) return 0;
  if (void* sym = ::dlsym(h, ACCEL_DRIVER_COUNT_SYMBOL)) {
    const int n = reinterpret_cast<accel_driver_count_devices_fn>(sym)();
    if (n >= 0) return n;  // negative: the library cannot count without initializing
  }
  std::unique_ptr<Driver> d = open_plugin_table(h, path, why);
  return d != nullptr ? d->device_count() : 0;
}

// The device count the runtime would start with, without starting it (no stream worker, no
// device context): ACCEL_DRIVER's choice as Runtime::start makes it.
int probe_device_count() {
  const Config c = Config::from_env();
  if (c.driver == "host") return HostDriverOptions::from_env().devices;
  if (c.driver != "auto") return count_plugin_devices(c, c.driver);
  for (const char* name : {"cuda", "level_zero"}) {
    const int n = count_plugin_devices(c, name);
    if (n > 0) return n;
  }
  return HostDriverOptions::from_env().devices;
}

std::once_flag g_once;
std::atomic<Runtime*> g_runtime{nullptr};
std::string g_init_error;  // written once under g_once, before g_init_tried is set
std::atomic<bool> g_init_tried{false};
std::atomic<bool> g_bad_fork{false};

void on_fork_child() {
  if (g_runtime.load() != nullptr) g_bad_fork.store(true);
}

[[maybe_unused]] const int g_fork_handler = [] {
  ::pthread_atfork(nullptr, nullptr, &on_fork_child);
  return 0;
}();

thread_local int t_device = 0;

}  // namespace

void Runtime::start() {
  config = Config::from_env();
  const auto start_host = [this] {
    owned_driver_ = make_host_driver(HostDriverOptions::from_env());
    driver_selection.emplace_back("host", "selected");
  };
  if (config.driver == "host") {
    start_host();
  } else if (config.driver == "auto") {
    // The first driver with a device, else the host driver; each skipped driver keeps why.
    for (const char* name : {"cuda", "level_zero"}) {
      std::string why;
      std::unique_ptr<Driver> d = load_plugin(config, name, why);
      if (d != nullptr && d->device_count() > 0) {
        owned_driver_ = std::move(d);
        driver_selection.emplace_back(name, "selected");
        break;
      }
      if (d != nullptr) why = "no device";
      driver_selection.emplace_back(name, "skipped: " + why);
    }
    if (!owned_driver_) start_host();
  } else {
    std::string why;
    owned_driver_ = load_plugin(config, config.driver, why);
    ACCEL_RT_CHECK(owned_driver_ != nullptr, InitError, "ACCEL_DRIVER=", config.driver, ": the ",
                   config.driver, " driver cannot be used: ", why,
                   ". Use ACCEL_DRIVER=host (always available) or auto");
    driver_selection.emplace_back(config.driver, "selected");
  }
  driver = owned_driver_.get();
  capabilities = driver->capabilities();
  num_devices = driver->device_count();
  ACCEL_RT_CHECK(num_devices > 0 && num_devices <= kMaxDevices, InitError, "the ", driver->name(),
                 " driver reports ", num_devices, " devices");
  priority_range = driver->stream_priority_range();
  for (int i = 0; i < num_devices; ++i) {
    auto ds = std::make_unique<DeviceState>();
    ds->index = i;
    ds->allocator = std::make_unique<CachingAllocator>(*this, i);
    ds->allocator->set_caching(config.memory_caching);
    devices.push_back(std::move(ds));
    // Slot 0; never released, so never recycled. Its generation 0 makes its id 0.
    StreamObj* def = acquire_stream(i, 0, /*pooled=*/false);
    def->generation.store(0);
  }
  host_allocator = std::make_unique<HostCachingAllocator>(*this);
}

Runtime& Runtime::get() {
  if (Runtime* rt = g_runtime.load(std::memory_order_acquire)) {
    if (__builtin_expect(g_bad_fork.load(std::memory_order_relaxed), 0)) {
      ACCEL_RT_THROW(InitError,
                     "the accel runtime cannot be used in a process forked after the parent "
                     "started it (its stream workers do not exist in the child). Start "
                     "subprocesses with the 'spawn' or 'forkserver' method, or use the device "
                     "only after fork()");
    }
    return *rt;
  }
  std::call_once(g_once, [] {
    try {
      std::unique_ptr<Runtime> rt(new Runtime());
      rt->start();
      g_runtime.store(rt.release(), std::memory_order_release);
    } catch (const Error& e) {
      g_init_error = e.message();
    } catch (const std::exception& e) {
      g_init_error = e.what();
    }
    g_init_tried.store(true, std::memory_order_release);
  });
  Runtime* rt = g_runtime.load(std::memory_order_acquire);
  ACCEL_RT_CHECK(rt != nullptr, InitError, "the accel runtime failed to start: ", g_init_error);
  return *rt;
}

Runtime* Runtime::get_if_initialized() noexcept {
  // In a forked child the runtime's locks may be held by threads that do not exist there.
  if (g_bad_fork.load(std::memory_order_relaxed)) return nullptr;
  return g_runtime.load(std::memory_order_acquire);
}

int tls_device() {
  return t_device;
}
void set_tls_device(int device) {
  t_device = device;
}

// --- validation ---------------------------------------------------------------------------

std::string describe(Stream s) {
  if (s.is_default()) return "the default stream of device " + std::to_string(s.device());
  std::ostringstream os;
  os << "stream 0x" << std::hex << s.id() << std::dec << " of device " << s.device();
  return os.str();
}

std::string describe(PoolId p) {
  return "pool (" + std::to_string(p.first) + ", " + std::to_string(p.second) + ")";
}

std::string Runtime::device_range_text() const {
  if (num_devices == 1) return "there is 1 accel device (valid index: 0)";
  return concat("there are ", num_devices, " accel devices (valid indices: 0 to ", num_devices - 1,
                ")");
}

int Runtime::resolve_device(int device, const char* call) const {
  const int d = device == -1 ? t_device : device;
  ACCEL_RT_CHECK(d >= 0 && d < num_devices, InvalidDeviceError, call, ": invalid device index ",
                 device, ": ", device_range_text());
  return d;
}

StreamObj& Runtime::stream(Stream s, const char* call) {
  const int dev = s.device();
  ACCEL_RT_CHECK(dev < num_devices, InvalidHandleError, call, ": ", describe(s),
                 " is not a valid stream: device ", dev, " does not exist");
  return checked(devices[dev]->streams, s.slot(), s.generation(), call, "stream",
                 [&] { return describe(s); });
}

namespace {
std::string describe_handle(const char* kind, uint64_t bits) {
  std::ostringstream os;
  os << kind << " 0x" << std::hex << bits;
  return os.str();
}
}  // namespace

EventObj& Runtime::event(Event e, const char* call) {
  return checked(events, e.slot(), e.generation(), call, "event",
                 [&] { return describe_handle("event", e.bits()); });
}

GraphObj& Runtime::graph(Graph g, const char* call) {
  return checked(graphs, g.slot(), g.generation(), call, "graph",
                 [&] { return describe_handle("graph", g.bits()); });
}

StreamObj* Runtime::acquire_stream(int device, int priority, bool pooled) {
  StreamObj* obj = devices[device]->streams.acquire(
      [&](StreamObj& s) { return !pooled && !s.pooled && s.priority == priority; },
      [&](uint32_t slot) {
        auto s = std::make_unique<StreamObj>();  // freed if the driver refuses
        s->device = device;
        s->slot = slot;
        s->priority = priority;
        s->pooled = pooled;
        s->ds = driver->stream_create(device, priority);
        return s.release();
      });
  obj->live.store(true, std::memory_order_release);
  return obj;
}

}  // namespace detail

using detail::Runtime;
using detail::StreamObj;

// --- runtime and devices ------------------------------------------------------------------

const char* version() noexcept {
  return ACCEL_VERSION;
}
void init() {
  Runtime::get();
}
bool is_initialized() noexcept {
  return Runtime::get_if_initialized() != nullptr;
}
bool in_bad_fork() noexcept {
  return detail::g_bad_fork.load();
}

int device_count_noexcept() noexcept {
  try {
    // The count stays known in a forked child (like torch.cuda.device_count).
    if (Runtime* rt = detail::g_runtime.load(std::memory_order_acquire)) return rt->num_devices;
    if (detail::g_init_tried.load(std::memory_order_acquire)) return 0;  // the start failed
    // Counting starts nothing (torch.cuda's rule), so a process may count, then fork workers
    // that use the devices. A count the start would refuse starts it, so that init_error() says
    // why.
    int n = 0;
    try {
      n = detail::probe_device_count();
    } catch (...) {  // NOLINT(bugprone-empty-catch): the start below reports the malformed setting
    }
    if (n > 0 && n <= kMaxDevices) return n;
    return Runtime::get().num_devices;
  } catch (...) {
    return 0;
  }
}

std::string init_error() noexcept {
  if (Runtime::get_if_initialized() != nullptr) return {};
  if (!detail::g_init_tried.load(std::memory_order_acquire)) return {};
  return detail::g_init_error;
}

int device_count() {
  return Runtime::get().num_devices;
}
const char* driver_name() {
  return Runtime::get().driver->name().data();
}
DriverCapabilities driver_capabilities() {
  return Runtime::get().capabilities;
}
std::vector<std::pair<std::string, std::string>> driver_selection() {
  return Runtime::get().driver_selection;
}
bool launch_blocking() {
  return Runtime::get().config.launch_blocking;
}

void set_device(int device) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(device >= 0, InvalidDeviceError, "set_device: invalid device index ", device, ": ",
                 rt.device_range_text());
  const int d = rt.resolve_device(device, "set_device");
  rt.driver->set_device(d);
  detail::set_tls_device(d);
}

int get_device() {
  Runtime::get();
  return detail::tls_device();
}

int exchange_device(int device) {
  const int previous = get_device();
  if (device != previous) set_device(device);
  return previous;
}

DeviceProperties get_device_properties(int device) {
  Runtime& rt = Runtime::get();
  detail::DeviceState& d = *rt.devices[rt.resolve_device(device, "get_device_properties")];
  std::call_once(d.properties_once, [&] { d.properties = rt.driver->device_properties(d.index); });
  return d.properties;
}

MemoryInfo mem_get_info(int device) {
  Runtime& rt = Runtime::get();
  return rt.driver->mem_get_info(rt.resolve_device(device, "mem_get_info"));
}

int64_t device_sensor(Sensor sensor, int device) {
  Runtime& rt = Runtime::get();
  return rt.driver->device_sensor(rt.resolve_device(device, "device_sensor"), sensor);
}

std::vector<DeviceProcess> device_processes(int device) {
  Runtime& rt = Runtime::get();
  return rt.driver->device_processes(rt.resolve_device(device, "device_processes"));
}

void device_synchronize(int device) {
  Runtime& rt = Runtime::get();
  if (device == -2) {
    for (int d = 0; d < rt.num_devices; ++d) device_synchronize(d);
    return;
  }
  const int d = rt.resolve_device(device, "device_synchronize");
  const bool skip_capturing = rt.check_device_sync(d, "device_synchronize");
  detail::DeviceState& ds = *rt.devices[d];
  const uint32_t n = ds.streams.size();
  std::string first_error;
  for (uint32_t slot = 0; slot < n; ++slot) {
    StreamObj* s = ds.streams.get(slot);
    if (s == nullptr || !s->live.load()) continue;
    if (skip_capturing && s->capturing.load()) continue;
    try {
      rt.driver->stream_synchronize(s->ds);
    } catch (const TaskError& e) {
      if (first_error.empty()) first_error = e.message();
    }
  }
  ACCEL_RT_CHECK(first_error.empty(), TaskError, "device_synchronize(device ", d,
                 "): ", first_error);
}

}  // namespace accel::rt
