// Pinned host memory: blocks are rounded up to a power of two (at least a page) and cached in
// one free list per size class. A block used by streams (host_record_stream) is reused only
// after events recorded on those streams at the time of the free have completed, so an
// asynchronous copy out of a freed staging buffer never sees it overwritten.
#include <bit>
#include <optional>

#include "runtime/caching_allocator.h"

namespace accel::rt::detail {

namespace {
constexpr std::size_t kMinHostBlock = 4096;

void bump(Stat& s, int64_t delta) {
  s.current += delta;
  if (s.current > s.peak) s.peak = s.current;
  if (delta > 0) s.allocated += delta;
  if (delta < 0) s.freed -= delta;
}
}  // namespace

HostCachingAllocator::~HostCachingAllocator() {
  for (auto& [addr, b] : blocks_) rt_.driver->host_free(b->ptr, b->size);
}

void* HostCachingAllocator::malloc(std::size_t size) {
  if (size == 0) return nullptr;
  ACCEL_RT_CHECK(size <= CachingAllocator::kMaxRequest, InvalidValueError, "host_malloc: ", size,
                 " bytes is not a valid size (a negative size converted to unsigned?)");
  const std::size_t rounded = std::max(kMinHostBlock, std::bit_ceil(size));
  const int cls = std::countr_zero(rounded);
  std::lock_guard<std::mutex> lock(mutex_);
  // No event query while a capture is underway (CUDA forbids it).
  if (!pending_.empty() && !rt_.capturing_anywhere()) process_events();
  HBlock* b = nullptr;
  if (!free_[cls].empty()) {
    b = free_[cls].back();
    free_[cls].pop_back();
  } else {
    // Pinned memory taken during a capture (a graph's random state on cuda: device/graph_rng.h)
    // is not stream work: allowed then.
    std::optional<RelaxedCaptureMode> relaxed;
    if (rt_.capturing_anywhere()) relaxed.emplace(*rt_.driver);
    void* p = rt_.driver->host_alloc(rounded);
    if (p == nullptr) {
      // Give cached blocks back (not during a capture: a free may synchronize) and try once
      // more.
      if (!relaxed) release_free_blocks();
      p = rt_.driver->host_alloc(rounded);
      ACCEL_RT_CHECK(p != nullptr, OutOfMemoryError,
                     "host_malloc: out of pinned host memory: "
                     "could not allocate ",
                     format_bytes(rounded), " (", size, " bytes requested)");
    }
    auto owned = std::make_unique<HBlock>();
    owned->ptr = p;
    owned->size = rounded;
    b = owned.get();
    blocks_[reinterpret_cast<uintptr_t>(p)] = std::move(owned);
    bump(stats_.segment, 1);
    bump(stats_.reserved_bytes, static_cast<int64_t>(rounded));
    ++stats_.num_host_alloc;
  }
  b->allocated = true;
  bump(stats_.allocation, 1);
  bump(stats_.allocated_bytes, static_cast<int64_t>(b->size));
  return b->ptr;
}

HostCachingAllocator::HBlock* HostCachingAllocator::find_containing(const void* ptr) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return nullptr;
  --it;
  HBlock* b = it->second.get();
  return p < it->first + b->size ? b : nullptr;
}

void HostCachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  ACCEL_RT_CHECK(it != blocks_.end() && it->second->allocated, InvalidPointerError, "host_free(",
                 format_ptr(ptr), "): ",
                 it == blocks_.end() ? "not the start of a pinned allocation of the runtime"
                                     : "the pinned block was already freed (double free)");
  HBlock* b = it->second.get();
  b->allocated = false;
  bump(stats_.allocation, -1);
  bump(stats_.allocated_bytes, -static_cast<int64_t>(b->size));
  for (Stream s : b->uses) {
    StreamObj* obj = rt_.devices[s.device()]->streams.get(s.slot());
    if (obj == nullptr || !obj->matches(s.generation())) continue;
    if (obj->capturing.load()) continue;  // captured work does not run now
    DriverEvent ev = rt_.pool_event(obj->device);
    rt_.driver->event_record(ev, obj->ds);
    pending_.emplace_back(ev, obj->device, b);
    ++b->events;
  }
  b->uses.clear();
  if (b->events == 0) to_free_list(b);
}

void HostCachingAllocator::to_free_list(HBlock* b) {
  free_[std::countr_zero(b->size)].push_back(b);
}

void HostCachingAllocator::process_events() {
  std::size_t kept = 0;
  for (auto& entry : pending_) {
    auto& [ev, device, b] = entry;
    if (rt_.driver->event_query(ev)) {
      rt_.return_event(device, ev);
      if (--b->events == 0) to_free_list(b);
    } else {
      pending_[kept++] = entry;
    }
  }
  pending_.resize(kept);
}

void HostCachingAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  HBlock* b = find_containing(ptr);
  ACCEL_RT_CHECK(b != nullptr && b->allocated, InvalidPointerError, "host_record_stream(",
                 format_ptr(ptr), "): not inside a live pinned allocation of the runtime");
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) {
    b->uses.push_back(stream);
  }
}

bool HostCachingAllocator::contains(const void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  HBlock* b = find_containing(ptr);
  if (b == nullptr || !b->allocated) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t start = reinterpret_cast<uintptr_t>(b->ptr);
  return size <= b->size - (p - start);
}

void HostCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rt_.capturing_anywhere()) return;  // nothing is freed during a capture
  process_events();
  release_free_blocks();
}

uintptr_t HostCachingAllocator::keep_block(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  HBlock* b = find_containing(ptr);
  if (b == nullptr) return 0;
  ++b->kept;
  return reinterpret_cast<uintptr_t>(b->ptr);
}

void HostCachingAllocator::unkeep_blocks(const std::vector<uintptr_t>& bases) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t base : bases) {
    auto it = blocks_.find(base);
    if (it != blocks_.end() && it->second->kept > 0) --it->second->kept;
  }
}

void HostCachingAllocator::release_free_blocks() {
  for (auto& list : free_) {
    std::vector<HBlock*> kept;  // a graph's copies still read or write them
    for (HBlock* b : list) {
      if (b->kept > 0) {
        kept.push_back(b);
        continue;
      }
      rt_.driver->host_free(b->ptr, b->size);
      bump(stats_.segment, -1);
      bump(stats_.reserved_bytes, -static_cast<int64_t>(b->size));
      ++stats_.num_host_free;
      blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));
    }
    list.swap(kept);
  }
}

HostStats HostCachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void HostCachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s :
       {&stats_.allocation, &stats_.segment, &stats_.allocated_bytes, &stats_.reserved_bytes}) {
    s->allocated = s->freed = 0;
  }
  stats_.num_host_alloc = stats_.num_host_free = 0;
}

void HostCachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* s :
       {&stats_.allocation, &stats_.segment, &stats_.allocated_bytes, &stats_.reserved_bytes}) {
    s->peak = s->current;
  }
}

}  // namespace accel::rt::detail
