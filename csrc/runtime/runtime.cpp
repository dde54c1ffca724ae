// Runtime start-up, configuration, driver selection, devices, streams, events and the rules
// for calls made while a graph capture is underway.
#include <dlfcn.h>
#include <pthread.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"

#ifndef ACCEL_VERSION
#define ACCEL_VERSION "0.0.0"
#endif

namespace accel::rt {
namespace detail {

// --- configuration ------------------------------------------------------------------------

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_bool(const char* variable, bool fallback) {
  const std::string v = lower(env(variable));
  if (v.empty()) return fallback;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  ACCEL_RT_THROW(InitError, variable, "='", v, "' is not a boolean: use 1 or 0");
}
}  // namespace

uint64_t parse_size(const std::string& text, const char* variable) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    // stoull accepts a sign and leading spaces ("-1" is 2^64-1): a size starts with a digit.
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
      throw std::invalid_argument(text);
    }
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    ACCEL_RT_THROW(InitError, variable, "='", text,
                   "' is not a size: use bytes or a number with K, M, G or T (binary units), "
                   "for example 4G");
  }
  std::string unit = lower(text.substr(pos));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();  // "gb", "gib"
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();  // "gi"
  int shift = 0;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "k") {
    shift = 10;
  } else if (unit == "m") {
    shift = 20;
  } else if (unit == "g") {
    shift = 30;
  } else if (unit == "t") {
    shift = 40;
  } else {
    ACCEL_RT_THROW(InitError, variable, "='", text, "': unknown unit '", text.substr(pos),
                   "' (use K, M, G or T)");
  }
  ACCEL_RT_CHECK(value <= (~uint64_t{0} >> shift), InitError, variable, "='", text,
                 "' is too large");
  return static_cast<uint64_t>(value) << shift;
}

Config Config::from_env() {
  Config c;
  const std::string driver = lower(env("ACCEL_DRIVER"));
  if (!driver.empty()) c.driver = driver;
  const bool name_ok = std::all_of(c.driver.begin(), c.driver.end(),
                                   [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; });
  ACCEL_RT_CHECK(name_ok, InitError, "ACCEL_DRIVER='", c.driver,
                 "' is not a driver name: use auto, host, cuda or level_zero");
  c.driver_path = env("ACCEL_DRIVER_PATH");
  const std::string devices = env("ACCEL_HOST_DEVICES");
  if (!devices.empty()) {
    std::size_t pos = 0;
    int n = 0;
    try {
      n = std::stoi(devices, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    ACCEL_RT_CHECK(pos == devices.size() && pos > 0 && n >= 1 && n <= kMaxDevices, InitError,
                   "ACCEL_HOST_DEVICES='", devices, "' must be a whole number from 1 to ",
                   kMaxDevices);
    c.host_devices = n;
  }
  const std::string memory = env("ACCEL_HOST_MEMORY");
  if (!memory.empty()) {
    c.host_memory = parse_size(memory, "ACCEL_HOST_MEMORY");
    ACCEL_RT_CHECK(c.host_memory >= (uint64_t{1} << 20), InitError, "ACCEL_HOST_MEMORY='", memory,
                   "' is too small: each device needs at least 1M");
  }
  c.launch_blocking = parse_bool("ACCEL_LAUNCH_BLOCKING", false);
  c.protect_device_memory = parse_bool("ACCEL_PROTECT_DEVICE_MEMORY", false);
  return c;
}

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
Driver* load_plugin(const Config& c, const std::string& name, void** handle, std::string& why) {
  const std::string dir = c.driver_path.empty() ? runtime_library_dir() : c.driver_path;
  const std::string path = dir + "/libaccel_driver_" + name + ".so";
  if (!file_exists(path)) {
    why = path + " does not exist (this build has no " + name + " driver)";
    return nullptr;
  }
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    why = "dlopen(" + path + ") failed: " + (e != nullptr ? e : "unknown error");
    return nullptr;
  }
  auto create = reinterpret_cast<DriverCreateFn>(::dlsym(h, "accel_driver_create"));
  if (create == nullptr) {
    why = path + " does not export accel_driver_create";
    ::dlclose(h);
    return nullptr;
  }
  char error[512] = {0};
  Driver* d = create(kDriverAbiVersion, error, sizeof(error));
  if (d == nullptr) {
    why = error[0] != 0 ? std::string(error) : "the driver refused to start";
    ::dlclose(h);
    return nullptr;
  }
  *handle = h;
  return d;
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
thread_local std::array<uint64_t, kMaxDevices> t_stream{};
thread_local uint64_t t_stream_set = 0;  // bit d: t_stream[d] holds the current stream

}  // namespace

void Runtime::start() {
  config = Config::from_env();
  HostDriverOptions host;
  host.devices = config.host_devices;
  host.memory_per_device = config.host_memory;
  host.protect_device_memory = config.protect_device_memory;
  host.launch_blocking = config.launch_blocking;

  if (config.driver == "host") {
    owned_driver_ = make_host_driver(host);
  } else if (config.driver == "auto") {
    for (const char* name : {"cuda", "level_zero"}) {
      std::string why;
      Driver* d = load_plugin(config, name, &plugin_, why);
      if (d != nullptr && d->device_count() > 0) {
        owned_driver_.reset(d);
        break;
      }
      delete d;
    }
    if (!owned_driver_) owned_driver_ = make_host_driver(host);
  } else {
    std::string why;
    Driver* d = load_plugin(config, config.driver, &plugin_, why);
    ACCEL_RT_CHECK(d != nullptr, InitError, "ACCEL_DRIVER=", config.driver, ": the ", config.driver,
                   " driver cannot be used: ", why,
                   ". Use ACCEL_DRIVER=host (always available) or auto");
    owned_driver_.reset(d);
  }
  driver = owned_driver_.get();
  num_devices = driver->device_count();
  ACCEL_RT_CHECK(num_devices > 0 && num_devices <= kMaxDevices, InitError, "the ", driver->name(),
                 " driver reports ", num_devices, " devices");
  priority_range = driver->stream_priority_range();
  for (int i = 0; i < num_devices; ++i) {
    auto ds = std::make_unique<DeviceState>();
    ds->index = i;
    ds->allocator = std::make_unique<CachingAllocator>(*this, i);
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
        auto* s = new StreamObj;
        s->device = device;
        s->slot = slot;
        s->priority = priority;
        s->pooled = pooled;
        s->ds = driver->stream_create(device, priority);
        return s;
      });
  obj->live.store(true, std::memory_order_release);
  return obj;
}

StreamObj& Runtime::current_stream_obj(int device) {
  if (t_stream_set & (uint64_t{1} << device)) {
    return stream(Stream::from_bits(t_stream[device]), "current stream");
  }
  return default_stream_obj(device);
}

// --- capture rules ------------------------------------------------------------------------

PoolId Runtime::capture_pool(StreamObj& s) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  return s.capture != nullptr ? s.capture->pool : PoolId{};
}

void Runtime::invalidate_and_throw(CaptureState& cs, const std::string& what) {
  if (cs.invalidated.empty()) {
    std::ostringstream os;
    os << what << " (called from thread " << std::this_thread::get_id() << ")";
    cs.invalidated = os.str();
  }
  throw CaptureError(
      ErrorCode::CaptureUnsupported,
      concat(what, " is not allowed while a graph capture is underway on ",
             describe(cs.origin->handle()), " (capture mode ", capture_mode_name(cs.mode),
             "): it would wait for work that is only being recorded, not run. The capture is "
             "now invalidated; graph_capture_end will end it and report this, after which the "
             "stream is usable again. Capture without this call."),
      __FILE__, __LINE__);
}

void Runtime::refuse_capture(StreamObj& s, const std::string& what, const std::string& why) {
  if (!s.capturing.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  if (s.capture == nullptr) return;
  CaptureState& cs = *s.capture;
  if (cs.invalidated.empty()) {
    std::ostringstream os;
    os << what << " (called from thread " << std::this_thread::get_id() << ")";
    cs.invalidated = os.str();
  }
  throw CaptureError(ErrorCode::CaptureUnsupported,
                     concat(what, " cannot be captured into a graph (", describe(s.handle()),
                            " is capturing): ", why,
                            ". The capture is now invalidated; graph_capture_end will end it and "
                            "report this, after which the stream is usable again."),
                     __FILE__, __LINE__);
}

void Runtime::check_not_capturing(StreamObj& s, const char* call) {
  if (!s.capturing.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  if (s.capture == nullptr) return;
  invalidate_and_throw(*s.capture, concat(call, "(", describe(s.handle()), ")"));
}

bool Runtime::check_device_sync(int device, const char* call) {
  if (devices[device]->captures.load() == 0) return false;
  std::lock_guard<std::mutex> lock(capture_mutex);
  for (auto& [id, cs] : live_captures) {
    if (cs->device != device) continue;
    const bool refuse =
        cs->mode == CaptureMode::Global ||
        (cs->mode == CaptureMode::ThreadLocal && cs->thread == std::this_thread::get_id());
    if (refuse) invalidate_and_throw(*cs, concat(call, "(device ", device, ")"));
  }
  return true;
}

void Runtime::check_event_not_captured(EventObj& e, const char* call) {
  const uint64_t id = e.capture_id.load(std::memory_order_acquire);
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  auto it = live_captures.find(id);
  if (it == live_captures.end()) return;
  invalidate_and_throw(*it->second, concat(call, " on an event recorded during the capture"));
}

void Runtime::synchronize_streams(int device, bool skip_capturing) {
  // Waits through events so that task failures stay reported to whoever synchronizes next.
  DeviceState& ds = *devices[device];
  const uint32_t n = ds.streams.size();
  for (uint32_t slot = 0; slot < n; ++slot) {
    StreamObj* s = ds.streams.get(slot);
    if (s == nullptr || !s->live.load()) continue;
    if (s->capturing.load() && skip_capturing) continue;
    if (driver->stream_query(s->ds)) continue;
    DriverEvent ev = pool_event(device);
    driver->event_record(ev, s->ds);
    driver->event_synchronize(ev);
    return_event(device, ev);
  }
}

DriverEvent Runtime::pool_event(int device) {
  DeviceState& ds = *devices[device];
  {
    std::lock_guard<std::mutex> lock(ds.event_pool_mutex);
    if (!ds.event_pool.empty()) {
      DriverEvent ev = ds.event_pool.back();
      ds.event_pool.pop_back();
      return ev;
    }
  }
  return driver->event_create(device, false);
}

void Runtime::return_event(int device, DriverEvent ev) {
  DeviceState& ds = *devices[device];
  std::lock_guard<std::mutex> lock(ds.event_pool_mutex);
  ds.event_pool.push_back(ev);
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
  return rt.driver->device_properties(rt.resolve_device(device, "get_device_properties"));
}

MemoryInfo mem_get_info(int device) {
  Runtime& rt = Runtime::get();
  return rt.driver->mem_get_info(rt.resolve_device(device, "mem_get_info"));
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

// --- streams ------------------------------------------------------------------------------

std::pair<int, int> stream_priority_range() {
  return Runtime::get().priority_range;
}

namespace {
int clamp_priority(Runtime& rt, int priority) {
  const auto [least, greatest] = rt.priority_range;
  return std::clamp(priority, greatest, least);
}
}  // namespace

Stream default_stream(int device) {
  Runtime& rt = Runtime::get();
  return rt.default_stream_obj(rt.resolve_device(device, "default_stream")).handle();
}

Stream stream_create(int device, int priority) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "stream_create");
  StreamObj* obj = rt.acquire_stream(d, clamp_priority(rt, priority), /*pooled=*/false);
  return obj->handle();
}

void stream_destroy(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_destroy");
  ACCEL_RT_CHECK(s.slot != 0, InvalidValueError, "stream_destroy: ", detail::describe(stream),
                 " cannot be destroyed");
  ACCEL_RT_CHECK(!s.pooled, InvalidValueError, "stream_destroy: ", detail::describe(stream),
                 " comes from the stream pool, which owns it");
  ACCEL_RT_CHECK(!s.capturing.load(), CaptureError, "stream_destroy: ", detail::describe(stream),
                 " is capturing a graph; end the capture first");
  std::string failure;
  try {
    rt.driver->stream_synchronize(s.ds);
  } catch (const TaskError& e) {
    failure = e.message();
  }
  // The driver stream is kept for reuse by a later stream_create: a racing user of the stale
  // handle can then never touch freed memory.
  s.retire();
  rt.devices[s.device]->streams.release(s.slot);
  ACCEL_RT_CHECK(failure.empty(), TaskError, "stream_destroy: ", failure);
}

Stream stream_from_pool(int device, int priority) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "stream_from_pool");
  const int p = clamp_priority(rt, priority);
  const int level = std::min(-(p - rt.priority_range.first), detail::kMaxPriorityLevels - 1);
  detail::DeviceState& ds = *rt.devices[d];
  const uint32_t idx = ds.pool_next[level].fetch_add(1) % detail::kPoolStreamsPerPriority;
  StreamObj* obj = ds.pool[level][idx].load(std::memory_order_acquire);
  if (obj == nullptr) {
    std::lock_guard<std::mutex> lock(ds.pool_mutex);
    obj = ds.pool[level][idx].load();
    if (obj == nullptr) {
      obj = rt.acquire_stream(d, p, /*pooled=*/true);
      ds.pool[level][idx].store(obj, std::memory_order_release);
    }
  }
  return obj->handle();
}

int stream_priority(Stream stream) {
  return Runtime::get().stream(stream, "stream_priority").priority;
}

Stream current_stream(int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "current_stream");
  if (detail::t_stream_set & (uint64_t{1} << d)) return Stream::from_bits(detail::t_stream[d]);
  return rt.default_stream_obj(d).handle();
}

void set_current_stream(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "set_current_stream");
  detail::t_stream[s.device] = stream.bits();
  detail::t_stream_set |= uint64_t{1} << s.device;
}

void stream_check(Stream stream) {
  Runtime::get().stream(stream, "stream_check");
}

void launch_host_func(Stream stream, Task task) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(static_cast<bool>(task), InvalidValueError, "launch_host_func: empty task");
  StreamObj& s = rt.stream(stream, "launch_host_func");
  rt.driver->launch_host_func(s.ds, std::move(task));
}

bool stream_query(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_query");
  rt.check_not_capturing(s, "stream_query");
  return rt.driver->stream_query(s.ds);
}

void stream_synchronize(Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& s = rt.stream(stream, "stream_synchronize");
  rt.check_not_capturing(s, "stream_synchronize");
  rt.driver->stream_synchronize(s.ds);
}

// --- events -------------------------------------------------------------------------------

Event event_create(int device, bool enable_timing) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "event_create");
  detail::EventObj* obj = rt.events.acquire(
      [&](detail::EventObj& e) {
        // Reuse only an event whose previous records have all completed: it then behaves
        // exactly like a fresh one.
        return e.device == d && e.timing == enable_timing && rt.driver->event_query(e.de);
      },
      [&](uint32_t slot) {
        auto* e = new detail::EventObj;
        e->slot = slot;
        e->device = d;
        e->timing = enable_timing;
        e->de = rt.driver->event_create(d, enable_timing);
        return e;
      });
  obj->recorded.store(false);
  obj->capture_id.store(0);
  obj->live.store(true, std::memory_order_release);
  return obj->handle();
}

void event_destroy(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_destroy");
  e.retire();
  rt.events.release(e.slot);
}

int event_device(Event event) {
  return Runtime::get().event(event, "event_device").device;
}

void event_record(Event event, Stream stream) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_record");
  StreamObj& s = rt.stream(stream, "event_record");
  ACCEL_RT_CHECK(e.device == s.device, InvalidValueError,
                 "event_record: the event belongs to "
                 "device ",
                 e.device, " but ", detail::describe(stream), " is on device ", s.device,
                 "; create the event on the stream's device");
  if (s.capturing.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(rt.capture_mutex);
    if (s.capture != nullptr) {
      rt.driver->event_record(e.de, s.ds);
      e.capture_id.store(s.capture->id);
      e.recorded.store(true);
      return;
    }
  }
  rt.driver->event_record(e.de, s.ds);
  e.capture_id.store(0);
  e.recorded.store(true);
}

void stream_wait_event(Stream stream, Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "stream_wait_event");
  StreamObj& s = rt.stream(stream, "stream_wait_event");
  if (const uint64_t id = e.capture_id.load(std::memory_order_acquire); id != 0) {
    std::lock_guard<std::mutex> lock(rt.capture_mutex);
    auto it = rt.live_captures.find(id);
    if (it != rt.live_captures.end()) {
      detail::CaptureState& cs = *it->second;
      ACCEL_RT_CHECK(s.capture == nullptr || s.capture == &cs, CaptureError,
                     "stream_wait_event: ", detail::describe(stream),
                     " is capturing another graph than the one the event was recorded in");
      ACCEL_RT_CHECK(s.device == cs.device, CaptureError,
                     "stream_wait_event: ", detail::describe(stream),
                     " cannot join a capture on device ", cs.device);
      rt.driver->stream_wait_event(s.ds, e.de);
      if (s.capture == nullptr) {  // the stream joins the capture
        s.capture = &cs;
        s.capturing.store(true, std::memory_order_release);
        cs.streams.push_back(&s);
      }
      return;
    }
  }
  rt.driver->stream_wait_event(s.ds, e.de);
}

bool event_query(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_query");
  rt.check_event_not_captured(e, "event_query");
  return rt.driver->event_query(e.de);
}

void event_synchronize(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_synchronize");
  rt.check_event_not_captured(e, "event_synchronize");
  rt.driver->event_synchronize(e.de);
}

float event_elapsed_time(Event start, Event end) {
  Runtime& rt = Runtime::get();
  detail::EventObj& a = rt.event(start, "event_elapsed_time");
  detail::EventObj& b = rt.event(end, "event_elapsed_time");
  for (auto [e, which] : {std::pair{&a, "start"}, std::pair{&b, "end"}}) {
    ACCEL_RT_CHECK(e->timing, InvalidValueError, "event_elapsed_time: the ", which,
                   " event was created without timing; create both events with timing "
                   "enabled (enable_timing=True)");
    ACCEL_RT_CHECK(e->recorded.load(), InvalidValueError, "event_elapsed_time: the ", which,
                   " event has not been recorded");
    rt.check_event_not_captured(*e, "event_elapsed_time");
    ACCEL_RT_CHECK(rt.driver->event_query(e->de), NotReadyError, "event_elapsed_time: the ", which,
                   " event has not completed yet; synchronize it first");
  }
  ACCEL_RT_CHECK(a.device == b.device, InvalidValueError,
                 "event_elapsed_time: the events belong to different devices (", a.device, " and ",
                 b.device, ")");
  return rt.driver->event_elapsed_ms(a.de, b.de);
}

}  // namespace accel::rt
