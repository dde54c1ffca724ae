// Device and pinned memory, copies and fills: argument checking and routing to the allocators
// and the driver.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"

namespace accel::rt {

using detail::Runtime;
using detail::StreamObj;

namespace {

template <class F>
void for_devices(int device, const char* call, F&& f) {
  Runtime& rt = Runtime::get();
  if (device == -2) {
    for (int d = 0; d < rt.num_devices; ++d) f(rt, d);
  } else {
    f(rt, rt.resolve_device(device, call));
  }
}

// Callbacks attached by users of the runtime, kept up to process exit.
template <class F>
struct Callbacks {
  std::mutex m;
  std::vector<F> list;

  void add(F f) {
    std::lock_guard<std::mutex> lock(m);
    list.push_back(std::move(f));
  }
  std::vector<F> snapshot() {
    std::lock_guard<std::mutex> lock(m);
    return list;
  }
};

Callbacks<OomObserver>& oom_observers() {
  static auto* o = new Callbacks<OomObserver>();
  return *o;
}

Callbacks<MemoryPressureHook>& pressure_hooks() {
  static auto* h = new Callbacks<MemoryPressureHook>();
  return *h;
}

// Allocates on `s`; on failure tells the observers, then rethrows.
void* observed_malloc(Runtime& rt, std::size_t size, StreamObj& s) {
  try {
    return rt.devices[s.device]->allocator->malloc(size, s);
  } catch (const OutOfMemoryError&) {
    const std::vector<OomObserver> observers = oom_observers().snapshot();
    if (!observers.empty()) {
      const auto allocated = static_cast<std::size_t>(
          rt.devices[s.device]->allocator->stats().allocated_bytes[kAggregate].current);
      const std::size_t free = rt.driver->mem_get_info(s.device).free;
      for (const OomObserver& o : observers) o(s.device, size, allocated, free);
    }
    throw;
  }
}

// Where one side of a copy lives.
struct Side {
  int device = -1;  // -1: host memory
  bool pinned = false;
  bool is_device() const { return device >= 0; }
};

Side classify(Runtime& rt, const void* ptr, std::size_t size, const char* call, const char* which) {
  ACCEL_RT_CHECK(ptr != nullptr, InvalidPointerError, call, ": the ", which, " pointer is null");
  Side side;
  for (int d = 0; d < rt.num_devices; ++d) {
    auto& alloc = *rt.devices[d]->allocator;
    if (!alloc.owns(ptr)) continue;
    bool freed = false;
    const auto [start, length] = alloc.allocation_containing(ptr, &freed);
    ACCEL_RT_CHECK(start != nullptr, InvalidPointerError, call, ": the ", which, " pointer ",
                   format_ptr(ptr), " points into device memory of device ", d,
                   " that is not allocated (it was freed, or was never handed out)");
    const std::size_t left = length - static_cast<std::size_t>(static_cast<const char*>(ptr) -
                                                               static_cast<const char*>(start));
    ACCEL_RT_CHECK(size <= left, InvalidValueError, call, ": ", size, " bytes at the ", which, " ",
                   format_ptr(ptr), " run past the end of its device allocation (", left,
                   " bytes left of ", length, ")");
    side.device = d;
    return side;
  }
  side.pinned = rt.host_allocator->contains(ptr, size);
  if (side.pinned) return side;
  // Memory the runtime did not allocate: what the driver knows of it (another library's device
  // memory, registered host memory), else pageable host memory.
  const PointerAttributes a = rt.driver->pointer_attributes(ptr);
  if (a.type == MemoryType::Device || a.type == MemoryType::Managed) {
    ACCEL_RT_CHECK(a.device >= 0 && a.device < rt.num_devices, InvalidPointerError, call, ": the ",
                   which, " pointer ", format_ptr(ptr), " is ", memory_type_name(a.type),
                   " memory of device ", a.device, ", which the runtime does not have");
    side.device = a.device;
  }
  side.pinned = a.type == MemoryType::Host;
  return side;
}

// The device whose allocator owns ptr (anywhere inside a segment), or -1.
int allocator_device(Runtime& rt, const void* ptr) {
  for (int d = 0; d < rt.num_devices; ++d) {
    if (rt.devices[d]->allocator->owns(ptr)) return d;
  }
  return -1;
}

const char* where(const Side& s) {
  return s.is_device() ? "device memory" : "host memory";
}

CopyKind resolve_kind(const Side& dst, const Side& src, CopyKind requested, const void* dptr,
                      const void* sptr, const char* call) {
  const CopyKind actual =
      src.is_device() ? (dst.is_device() ? CopyKind::DeviceToDevice : CopyKind::DeviceToHost)
                      : (dst.is_device() ? CopyKind::HostToDevice : CopyKind::HostToHost);
  if (requested == CopyKind::Default || requested == actual) return actual;
  const bool want_src_dev =
      requested == CopyKind::DeviceToHost || requested == CopyKind::DeviceToDevice;
  const bool want_dst_dev =
      requested == CopyKind::HostToDevice || requested == CopyKind::DeviceToDevice;
  if (want_src_dev != src.is_device()) {
    ACCEL_RT_THROW(InvalidValueError, call, "(kind=", copy_kind_name(requested), "): the source ",
                   format_ptr(sptr), " is ", where(src), ", not ",
                   want_src_dev ? "device memory" : "host memory",
                   " (use CopyKind::Default to infer the direction)");
  }
  ACCEL_RT_THROW(InvalidValueError, call, "(kind=", copy_kind_name(requested),
                 "): the destination ", format_ptr(dptr), " is ", where(dst), ", not ",
                 want_dst_dev ? "device memory" : "host memory",
                 " (use CopyKind::Default to infer the direction)");
}

}  // namespace

// --- device memory ------------------------------------------------------------------------

void* malloc(std::size_t size, Stream stream) {
  Runtime& rt = Runtime::get();
  return observed_malloc(rt, size, rt.stream(stream, "malloc"));
}

void* malloc(std::size_t size) {
  Runtime& rt = Runtime::get();
  return observed_malloc(rt, size, rt.current_stream_obj(detail::tls_device()));
}

namespace detail {
bool relieve_memory_pressure(int device, std::size_t requested) {
  bool freed = ipc_collect(device) > 0;  // allocations other processes released
  for (const MemoryPressureHook& h : pressure_hooks().snapshot()) {
    freed = h(device, requested) || freed;
  }
  return freed;
}
}  // namespace detail

void attach_memory_pressure_hook(MemoryPressureHook hook) {
  ACCEL_RT_CHECK(static_cast<bool>(hook), InvalidValueError,
                 "attach_memory_pressure_hook: the hook is empty");
  pressure_hooks().add(std::move(hook));
}

void attach_oom_observer(OomObserver observer) {
  ACCEL_RT_CHECK(static_cast<bool>(observer), InvalidValueError,
                 "attach_oom_observer: the observer is empty");
  oom_observers().add(std::move(observer));
}

void set_memory_fraction(double fraction, int device) {
  ACCEL_RT_CHECK(fraction >= 0.0 && fraction <= 1.0, InvalidValueError,
                 "set_memory_fraction: ", fraction, " is not a fraction between 0 and 1");
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "set_memory_fraction");
  const std::size_t total = rt.driver->mem_get_info(d).total;
  // 1.0 is no limit; any smaller fraction at least one byte short of the whole device.
  const std::size_t limit =
      fraction >= 1.0 ? 0 : std::max<std::size_t>(1, static_cast<std::size_t>(fraction * total));
  rt.devices[d]->allocator->set_reserve_limit(limit);
}

PoolId mem_pool_create(int device, MemPoolOptions options) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "mem_pool_create");
  const PoolId id{0, rt.next_pool_id.fetch_add(1)};
  rt.devices[d]->allocator->create_pool(id, options);
  return id;
}

void mem_pool_release(int device, PoolId pool) {
  Runtime& rt = Runtime::get();
  rt.device_state(device, "mem_pool_release").allocator->release_pool(pool, /*empty_now=*/true);
}

int mem_pool_use_count(int device, PoolId pool) {
  Runtime& rt = Runtime::get();
  return rt.device_state(device, "mem_pool_use_count").allocator->pool_use_count(pool);
}

void mem_pool_begin_allocate(int device, PoolId pool) {
  ACCEL_RT_CHECK(!pool.is_default(), InvalidValueError,
                 "mem_pool_begin_allocate: (0, 0) is the default pool, not a memory pool");
  Runtime& rt = Runtime::get();
  rt.device_state(device, "mem_pool_begin_allocate")
      .allocator->begin_allocate_to_pool(pool, std::this_thread::get_id());
}

void mem_pool_end_allocate(int device, PoolId pool) {
  Runtime& rt = Runtime::get();
  rt.device_state(device, "mem_pool_end_allocate")
      .allocator->end_allocate_to_pool(pool, std::this_thread::get_id());
}

double get_memory_fraction(int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "get_memory_fraction");
  const std::size_t limit = rt.devices[d]->allocator->reserve_limit();
  if (limit == 0) return 1.0;
  return static_cast<double>(limit) / static_cast<double>(rt.driver->mem_get_info(d).total);
}

void free(void* ptr) {
  if (ptr == nullptr) return;
  Runtime& rt = Runtime::get();
  if (detail::ipc_keeps(ptr)) return;
  const int first = detail::tls_device();
  if (rt.devices[first]->allocator->free(ptr)) return;
  for (int d = 0; d < rt.num_devices; ++d) {
    if (d != first && rt.devices[d]->allocator->free(ptr)) return;
  }
  for (int d = 0; d < rt.num_devices; ++d) {
    ACCEL_RT_CHECK(!rt.devices[d]->allocator->owns(ptr), InvalidPointerError, "free(",
                   format_ptr(ptr), "): the pointer lies in device memory of device ", d,
                   " but is not the start of a live allocation: it was already freed (double "
                   "free) or points into the middle of an allocation");
  }
  ACCEL_RT_THROW(InvalidPointerError, "free(", format_ptr(ptr),
                 "): the pointer was not returned by accel::rt::malloc");
}

void record_stream(void* ptr, Stream stream) {
  Runtime& rt = Runtime::get();
  rt.stream(stream, "record_stream");
  for (int d = 0; d < rt.num_devices; ++d) {
    if (rt.devices[d]->allocator->record_stream(ptr, stream)) return;
  }
  ACCEL_RT_THROW(InvalidPointerError, "record_stream(", format_ptr(ptr),
                 "): not the start of a live device allocation");
}

int pointer_device(const void* ptr) noexcept {
  Runtime* rt = Runtime::get_if_initialized();
  if (rt == nullptr || ptr == nullptr) return -1;
  if (const int d = allocator_device(*rt, ptr); d >= 0) return d;
  return detail::ipc_device_of(ptr);  // memory of another process mapped here
}

std::pair<void*, std::size_t> allocation_range(const void* ptr) {
  Runtime& rt = Runtime::get();
  for (int d = 0; d < rt.num_devices; ++d) {
    auto r = rt.devices[d]->allocator->allocation_containing(ptr, nullptr);
    if (r.first != nullptr) return r;
  }
  return {nullptr, 0};
}

void set_memory_caching(bool enabled, int device) {
  for_devices(device, "set_memory_caching",
              [enabled](Runtime& rt, int d) { rt.devices[d]->allocator->set_caching(enabled); });
}

void set_device_allocator(SegmentAllocator allocator) {
  ACCEL_RT_CHECK((allocator.alloc == nullptr) == (allocator.free == nullptr), InvalidValueError,
                 "set_device_allocator: give both an alloc and a free function, or neither (the "
                 "driver's)");
  Runtime& rt = Runtime::get();
  // Refused before any device changes.
  for (int d = 0; d < rt.num_devices; ++d) rt.devices[d]->allocator->check_allocator_can_change();
  for (int d = 0; d < rt.num_devices; ++d) rt.devices[d]->allocator->set_allocator(allocator);
}

SegmentAllocator device_allocator() {
  Runtime& rt = Runtime::get();
  return rt.num_devices > 0 ? rt.devices[0]->allocator->allocator() : SegmentAllocator{};
}

bool memory_caching(int device) {
  Runtime& rt = Runtime::get();
  return rt.devices[rt.resolve_device(device, "memory_caching")]->allocator->caching();
}

void set_allocator_settings(const AllocatorSettings& settings) {
  const double t = settings.garbage_collection_threshold;
  ACCEL_RT_CHECK(t >= 0.0 && t < 1.0, InvalidValueError,
                 "set_allocator_settings: garbage_collection_threshold must be in [0, 1), got ", t);
  ACCEL_RT_CHECK(settings.max_split_size > detail::CachingAllocator::kLargeBuffer,
                 InvalidValueError, "set_allocator_settings: max_split_size must be more than ",
                 format_bytes(detail::CachingAllocator::kLargeBuffer), " (a large segment), got ",
                 format_bytes(settings.max_split_size));
  for (std::size_t d : settings.roundup_power2_divisions) {
    ACCEL_RT_CHECK(d <= 1 || (d & (d - 1)) == 0, InvalidValueError,
                   "set_allocator_settings: roundup_power2_divisions must be powers of two, got ",
                   d);
  }
  for_devices(-2, "set_allocator_settings",
              [&](Runtime& rt, int d) { rt.devices[d]->allocator->set_settings(settings); });
}

AllocatorSettings allocator_settings() {
  return Runtime::get().devices[0]->allocator->settings();
}

void empty_cache(int device) {
  for_devices(device, "empty_cache",
              [](Runtime& rt, int d) { rt.devices[d]->allocator->empty_cache(); });
}

DeviceStats memory_stats(int device) {
  Runtime& rt = Runtime::get();
  return rt.devices[rt.resolve_device(device, "memory_stats")]->allocator->stats();
}

void reset_peak_memory_stats(int device) {
  for_devices(device, "reset_peak_memory_stats",
              [](Runtime& rt, int d) { rt.devices[d]->allocator->reset_peak_stats(); });
}

void reset_accumulated_memory_stats(int device) {
  for_devices(device, "reset_accumulated_memory_stats",
              [](Runtime& rt, int d) { rt.devices[d]->allocator->reset_accumulated_stats(); });
}

void record_memory_history(bool enabled, ContextRecorder recorder, std::size_t max_entries,
                           ContextLevel level) {
  Runtime& rt = Runtime::get();
  for (int d = 0; d < rt.num_devices; ++d) {
    rt.devices[d]->allocator->set_history(enabled, recorder, max_entries, level);
  }
}

MemorySnapshot memory_snapshot() {
  Runtime& rt = Runtime::get();
  MemorySnapshot snap;
  for (int d = 0; d < rt.num_devices; ++d) rt.devices[d]->allocator->snapshot(snap);
  return snap;
}

// --- pinned host memory -------------------------------------------------------------------

void* host_malloc(std::size_t size) {
  return Runtime::get().host_allocator->malloc(size);
}
void host_free(void* ptr) {
  Runtime::get().host_allocator->free(ptr);
}

void host_record_stream(void* ptr, Stream stream) {
  Runtime& rt = Runtime::get();
  rt.stream(stream, "host_record_stream");
  rt.host_allocator->record_stream(ptr, stream);
}

PointerAttributes pointer_attributes(const void* ptr) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(ptr != nullptr, InvalidPointerError, "pointer_attributes: the pointer is null");
  if (const int d = allocator_device(rt, ptr); d >= 0) {
    return {.type = MemoryType::Device, .device = d, .runtime_allocated = true};
  }
  if (is_pinned(ptr)) return {.type = MemoryType::Host, .runtime_allocated = true};
  PointerAttributes a = rt.driver->pointer_attributes(ptr);
  a.runtime_allocated = false;
  if (a.type != MemoryType::Device && a.type != MemoryType::Managed) a.device = -1;
  return a;
}

bool is_pinned(const void* ptr) noexcept {
  Runtime* rt = Runtime::get_if_initialized();
  if (rt == nullptr || ptr == nullptr) return false;
  try {
    return rt->host_allocator->contains(ptr, 1);
  } catch (...) {
    return false;
  }
}

void host_empty_cache() {
  Runtime::get().host_allocator->empty_cache();
}
HostStats host_memory_stats() {
  return Runtime::get().host_allocator->stats();
}
void host_reset_peak_stats() {
  Runtime::get().host_allocator->reset_peak_stats();
}
void host_reset_accumulated_stats() {
  Runtime::get().host_allocator->reset_accumulated_stats();
}

// --- copies -------------------------------------------------------------------------------

// Copies and fills in traces (runtime/trace.h): while recording, on drivers that run host
// functions and outside captures, marker tasks on the stream note when the driver's work
// started (before it) and ended (after it).
std::shared_ptr<trace::TaskRecord> trace_open(Runtime& rt, StreamObj& st, const char* label,
                                              trace::Kind kind) {
  if (!trace::enabled() || st.capturing.load(std::memory_order_relaxed) ||
      !rt.capabilities.host_functions) {
    return nullptr;
  }
  auto r = trace::open(st.handle(), label, kind);
  rt.driver->launch_host_func(st.ds, Task([r] { r->start_ns = trace::now_ns(); }), "trace");
  return r;
}

void trace_close(Runtime& rt, StreamObj& st, const std::shared_ptr<trace::TaskRecord>& r) {
  if (r) rt.driver->launch_host_func(st.ds, Task([r] { trace::close(*r); }), "trace");
}

const char* copy_name(CopyKind k) {
  switch (k) {
    case CopyKind::HostToDevice: return "Memcpy HtoD";
    case CopyKind::DeviceToHost: return "Memcpy DtoH";
    case CopyKind::DeviceToDevice: return "Memcpy DtoD";
    default: return "Memcpy";
  }
}

void memcpy(void* dst, const void* src, std::size_t size, CopyKind kind) {
  if (size == 0) return;
  Runtime& rt = Runtime::get();
  const Side d = classify(rt, dst, size, "memcpy", "destination");
  const Side s = classify(rt, src, size, "memcpy", "source");
  const CopyKind k = resolve_kind(d, s, kind, dst, src, "memcpy");
  if (k == CopyKind::HostToHost) {
    std::memcpy(dst, src, size);
    return;
  }
  StreamObj& stream = rt.current_stream_obj(d.is_device() ? d.device : s.device);
  rt.check_not_capturing(stream, "memcpy");
  rt.check_wait_allowed(stream, "memcpy");
  // The call waits for the copy, so even pageable memory can be used directly.
  auto traced = trace_open(rt, stream, copy_name(k), trace::Kind::Memcpy);
  rt.driver->memcpy_async(dst, src, size, k, stream.ds);
  trace_close(rt, stream, traced);
  rt.driver->stream_synchronize(stream.ds);
}

void memcpy_async(void* dst, const void* src, std::size_t size, CopyKind kind, Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& st = rt.stream(stream, "memcpy_async");
  if (size == 0) return;
  const Side d = classify(rt, dst, size, "memcpy_async", "destination");
  const Side s = classify(rt, src, size, "memcpy_async", "source");
  const CopyKind k = resolve_kind(d, s, kind, dst, src, "memcpy_async");
  const bool src_pageable = !s.is_device() && !s.pinned;
  const bool dst_pageable = !d.is_device() && !d.pinned;
  if (src_pageable || dst_pageable) {
    // A graph would read or write pageable memory at replay time, long after the caller
    // moved on: only pinned memory can be captured.
    rt.check_not_capturing(st, "memcpy_async with pageable host memory");
  }
  // Pageable results are waited for (below).
  if (dst_pageable) rt.check_wait_allowed(st, "memcpy_async to pageable host memory");
  auto traced = trace_open(rt, st, copy_name(k), trace::Kind::Memcpy);
  if (k == CopyKind::HostToDevice && src_pageable) {
    // Stage through pinned memory so the caller may reuse the source at once.
    void* staging = rt.host_allocator->malloc(size);
    std::memcpy(staging, src, size);
    rt.driver->memcpy_async(dst, staging, size, k, st.ds);
    trace_close(rt, st, traced);
    rt.host_allocator->record_stream(staging, stream);
    rt.host_allocator->free(staging);
    return;
  }
  if (!dst_pageable) rt.keep_for_capture(st, dst);  // device or pinned memory
  if (!src_pageable) rt.keep_for_capture(st, src);
  rt.driver->memcpy_async(dst, src, size, k, st.ds);
  trace_close(rt, st, traced);
  if (dst_pageable) rt.driver->stream_synchronize(st.ds);  // pageable results must be there
}

void memset(void* dst, int value, std::size_t size) {
  if (size == 0) return;
  Runtime& rt = Runtime::get();
  const Side d = classify(rt, dst, size, "memset", "destination");
  ACCEL_RT_CHECK(d.is_device(), InvalidValueError, "memset: the destination ", format_ptr(dst),
                 " is host memory, not device memory");
  StreamObj& stream = rt.current_stream_obj(d.device);
  rt.check_not_capturing(stream, "memset");
  rt.check_wait_allowed(stream, "memset");
  auto traced = trace_open(rt, stream, "Memset", trace::Kind::Memset);
  rt.driver->memset_async(dst, value, size, stream.ds);
  trace_close(rt, stream, traced);
  rt.driver->stream_synchronize(stream.ds);
}

void memset_async(void* dst, int value, std::size_t size, Stream stream) {
  Runtime& rt = Runtime::get();
  StreamObj& st = rt.stream(stream, "memset_async");
  if (size == 0) return;
  const Side d = classify(rt, dst, size, "memset_async", "destination");
  ACCEL_RT_CHECK(d.is_device(), InvalidValueError, "memset_async: the destination ",
                 format_ptr(dst), " is host memory, not device memory");
  rt.keep_for_capture(st, dst);
  auto traced = trace_open(rt, st, "Memset", trace::Kind::Memset);
  rt.driver->memset_async(dst, value, size, st.ds);
  trace_close(rt, st, traced);
}

// --- host access --------------------------------------------------------------------------

bool device_memory_host_accessible() {
  return Runtime::get().capabilities.host_accessible_memory;
}

HostAccessGuard::HostAccessGuard(const void* ptr, std::size_t size)
    : device_(pointer_device(ptr)), ptr_(ptr), size_(size) {
  if (device_ >= 0) Runtime::get().driver->host_access_begin(device_, ptr_, size_);
}

HostAccessGuard::~HostAccessGuard() {
  if (device_ >= 0) Runtime::get().driver->host_access_end(device_, ptr_, size_);
}

}  // namespace accel::rt
