// c10::DeviceAllocator over the runtime's caching allocator, so that torch.accelerator.memory_*
// report its statistics, and at::HostAllocator over the runtime's pinned memory.
#include "device/allocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "device/common.h"

namespace accel::device {
namespace {

// torch.profiler(profile_memory=True): allocations and frees of accel memory, reported on the
// thread that makes them (the profiler's state is thread-local), with the device's totals.
void report_to_profiler(void* ptr, int64_t delta, int device) {
  const rt::DeviceStats stats = rt::memory_stats(device);
  c10::reportMemoryUsageToProfiler(
      ptr, delta, static_cast<size_t>(stats.allocated_bytes[rt::kAggregate].current),
      static_cast<size_t>(stats.reserved_bytes[rt::kAggregate].current),
      c10::Device(kAccel, static_cast<c10::DeviceIndex>(device)));
}

void free_device(void* ptr) noexcept {
  try {
    if (ptr != nullptr && c10::memoryProfilingEnabled()) {
      const auto [base, size] = rt::allocation_range(ptr);
      const int device = rt::pointer_device(ptr);
      rt::free(ptr);
      report_to_profiler(ptr, -static_cast<int64_t>(size), device);
      return;
    }
    rt::free(ptr);
  } catch (const std::exception& e) {
    // A deleter cannot throw; a failure here is a runtime bug worth seeing.
    std::fprintf(stderr, "accel: freeing device memory failed: %s\n", e.what());
  }
}

void free_host(void* ptr) noexcept {
  try {
    rt::host_free(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel: freeing pinned memory failed: %s\n", e.what());
  }
}

c10::CachingAllocator::Stat convert(const rt::Stat& s) {
  c10::CachingAllocator::Stat out;
  out.current = s.current;
  out.peak = s.peak;
  out.allocated = s.allocated;
  out.freed = s.freed;
  return out;
}

c10::CachingAllocator::StatArray convert(const rt::StatArray& a) {
  c10::CachingAllocator::StatArray out;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = convert(a[i]);
  return out;
}

std::once_flag g_config_applied;

class AccelDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    std::call_once(g_config_applied, [] { apply_allocator_config(); });
    return call([&] {
      const int device = rt::get_device();
      void* ptr = rt::malloc(nbytes, rt::current_stream(device));
      if (ptr != nullptr && c10::memoryProfilingEnabled()) {
        report_to_profiler(ptr, static_cast<int64_t>(rt::allocation_range(ptr).second), device);
      }
      return c10::DataPtr(ptr, ptr, &free_device,
                          c10::Device(kAccel, static_cast<c10::DeviceIndex>(device)));
    });
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_device; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    call([&] { rt::memcpy(dest, src, count, rt::CopyKind::DeviceToDevice); });
  }

  bool initialized() override { return rt::is_initialized(); }

  void emptyCache(c10::MempoolId_t) override {
    call([] { rt::empty_cache(-2); });
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    // Memory this allocator did not hand out (imported from another process: its mapping is
    // closed only after the streams passed the work queued on it) has nothing to record.
    if (ptr.get() == nullptr || ptr.get_deleter() != &free_device) return;
    call([&] { rt::record_stream(ptr.get(), to_rt(stream)); });
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const rt::DeviceStats s = call([&] { return rt::memory_stats(resolve_device(device)); });
    c10::CachingDeviceAllocator::DeviceStats out;
    out.allocation = convert(s.allocation);
    out.segment = convert(s.segment);
    out.active = convert(s.active);
    out.inactive_split = convert(s.inactive_split);
    out.allocated_bytes = convert(s.allocated_bytes);
    out.reserved_bytes = convert(s.reserved_bytes);
    out.active_bytes = convert(s.active_bytes);
    out.inactive_split_bytes = convert(s.inactive_split_bytes);
    out.requested_bytes = convert(s.requested_bytes);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.max_split_size = s.max_split_size;
    out.oversize_allocations = convert(s.oversize_allocations);
    out.oversize_segments = convert(s.oversize_segments);
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    call([&] { rt::reset_accumulated_memory_stats(resolve_device(device)); });
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    call([&] { rt::reset_peak_memory_stats(resolve_device(device)); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    const rt::MemoryInfo info = call([&] { return rt::mem_get_info(resolve_device(device)); });
    return {static_cast<size_t>(info.free), static_cast<size_t>(info.total)};
  }
};

class AccelHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = call([&] { return rt::host_malloc(nbytes); });
    return c10::DataPtr(ptr, ptr, &free_host, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    void* base = ctx != nullptr ? ctx : ptr;
    if (base == nullptr || !rt::is_pinned(base)) return false;
    call([&] { rt::host_record_stream(base, to_rt(stream)); });
    return true;
  }

  void empty_cache() override {
    call([] { rt::host_empty_cache(); });
  }

  at::HostStats get_stats() override {
    const rt::HostStats s = call([] { return rt::host_memory_stats(); });
    at::HostStats out;
    out.active_requests = convert(s.allocation);
    out.active_bytes = convert(s.allocated_bytes);
    out.allocations = convert(s.segment);
    out.allocated_bytes = convert(s.reserved_bytes);
    out.num_host_alloc = s.num_host_alloc;
    out.num_host_free = s.num_host_free;
    return out;
  }

  void reset_accumulated_stats() override {
    call([] { rt::host_reset_accumulated_stats(); });
  }

  void reset_peak_stats() override {
    call([] { rt::host_reset_peak_stats(); });
  }
};

AccelDeviceAllocator g_device_allocator;
AccelHostAllocator g_host_allocator;

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator);

}  // namespace

namespace {
void release_import(void* ptr) noexcept {
  try {
    rt::ipc_release(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel: releasing memory shared by another process failed: %s\n",
                 e.what());
  }
}
}  // namespace

c10::DataPtr import_data_ptr(void* ptr, int device) {
  return c10::DataPtr(ptr, ptr, &release_import,
                      c10::Device(kAccel, static_cast<c10::DeviceIndex>(device)));
}

c10::Allocator* device_allocator() {
  return &g_device_allocator;
}
c10::Allocator* host_allocator() {
  return &g_host_allocator;
}

void apply_allocator_config() {
  using Config = c10::CachingAllocator::AcceleratorAllocatorConfig;
  rt::AllocatorSettings settings;
  settings.max_split_size = Config::max_split_size();
  settings.max_non_split_rounding = Config::max_non_split_rounding_size();
  settings.garbage_collection_threshold = Config::garbage_collection_threshold();
  settings.roundup_power2_divisions = Config::roundup_power2_divisions();
  settings.expandable_segments = Config::use_expandable_segments();
  if (settings.expandable_segments &&
      !call([] { return rt::driver_capabilities().virtual_memory; })) {
    TORCH_WARN_ONCE("the ", rt::driver_name(),
                    " driver has no virtual memory, which expandable segments need: "
                    "expandable_segments in PYTORCH_ALLOC_CONF is ignored for accel devices");
  }
  if (Config::large_segment_size() != (std::size_t{20} << 20)) {
    TORCH_WARN_ONCE(
        "accel's caching allocator keeps 20 MiB large segments: large_segment_size_mb "
        "in PYTORCH_ALLOC_CONF is ignored for accel devices");
  }
  call([&] { rt::set_allocator_settings(settings); });
}

}  // namespace accel::device
