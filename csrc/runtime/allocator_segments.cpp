// Where the caching allocator's segments come from and go back to: the driver, or the
// functions a user gives (SegmentAllocator: a MemPool's own, or the device's current allocator).
#include "runtime/allocator_blocks.h"
#include "runtime/allocator_maps.h"
#include "runtime/caching_allocator.h"

#include <iterator>

namespace accel::rt::detail {

bool CachingAllocator::segment_view(const void* ptr, SegmentView* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* head = segment_of(ptr);
  if (head == nullptr) return false;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (Block* b = head; b != nullptr; b = b->next) {
    if (p < b->addr() || p >= b->addr() + b->size) continue;
    if (!b->allocated) return false;
    out->alloc = b->ptr;
    break;
  }
  if (out->alloc == nullptr) return false;
  out->base = head->ptr;
  out->size = head->segment_size;
  if (!head->pool->allocator.is_driver()) {
    out->why_not =
        "it comes from a pluggable allocator (MemPool(allocator=...) or "
        "change_current_allocator), whose memory belongs to that allocator";
  }
  return true;
}

Block* CachingAllocator::alloc_segment(BlockPool& pool, StreamObj& stream, std::size_t size) {
  if (reserve_limit_ != 0 &&
      static_cast<std::size_t>(stats_.reserved_bytes[kAggregate].current) + size > reserve_limit_) {
    return nullptr;  // the per-process memory fraction is used up
  }
  void* p;
  if (stream.capturing.load(std::memory_order_acquire)) {
    // Memory for the capture's own pool: allowed while capturing.
    const RelaxedCaptureMode relaxed(*rt_.driver);
    p = segment_memory(pool, stream, size);
  } else {
    check_new_memory(size, stream);
    p = segment_memory(pool, stream, size);
  }
  if (p == nullptr) return nullptr;
  Block* b = arena_->make();
  b->ptr = p;
  b->size = size;
  b->segment_size = size;
  b->stream = &stream;
  b->pool = &pool;
  segments_[b->addr()] = b;
  ++pool.segments;
  update_stat(stats_.segment, pool.small, 1);
  update_stat(stats_.reserved_bytes, pool.small, static_cast<int64_t>(size));
  if (oversize(size)) update_stat(stats_.oversize_segments, 1);
  ++stats_.num_device_alloc;
  record_trace(TraceEntry::Action::SegmentAlloc, b->addr(), size, &stream, pool.id, nullptr);
  return b;
}

void* CachingAllocator::segment_memory(BlockPool& pool, StreamObj& stream, std::size_t size) {
  if (pool.allocator.is_driver()) return rt_.driver->raw_alloc(device_, size);
  rt_.driver->set_device(device_);
  void* p = pool.allocator.alloc(size, device_, rt_.driver->stream_native_handle(stream.ds));
  if (p == nullptr) return nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto next = segments_.lower_bound(a);
  const bool overlaps =
      (next != segments_.end() && next->first < a + size) || (next != segments_.begin() && [&] {
        const Block* prev = std::prev(next)->second;
        return prev->addr() + prev->segment_size > a;
      }());
  if (overlaps || a + size < a) {
    // Not given back: the allocator handed out memory that is in use, its free could release it.
    ACCEL_RT_THROW(InvalidValueError, "the allocator of device ", device_, " returned ",
                   format_ptr(p), " for a segment of ", size,
                   " bytes, which overlaps memory it already gave the device (a segment not yet "
                   "freed); each call must return memory of its own");
  }
  return p;
}

void CachingAllocator::release_segment(Block* head) {
  BlockPool& pool = *head->pool;
  pool.bins_of(head).remove(head);
  segments_.erase(head->addr());
  --pool.segments;
  update_stat(stats_.segment, pool.small, -1);
  update_stat(stats_.reserved_bytes, pool.small, -static_cast<int64_t>(head->segment_size));
  if (oversize(head->segment_size)) update_stat(stats_.oversize_segments, -1);
  ++stats_.num_device_free;
  record_trace(TraceEntry::Action::SegmentFree, head->addr(), head->segment_size, head->stream,
               pool.id, nullptr);
  if (pool.allocator.is_driver()) {
    rt_.driver->raw_free(device_, head->ptr, head->segment_size);  // the driver waits for use
  } else {
    // A user's free may release the memory at once: only after the segment's stream passed
    // its work (its blocks were all allocated on that stream; other streams' uses were waited
    // for before the blocks became free).
    PendingUserFree f{nullptr, head->ptr, head->segment_size, head->stream, pool.allocator};
    if (rt_.driver->stream_query(f.stream->ds)) {
      user_free(f);
    } else {
      f.event = rt_.pool_event(device_);
      rt_.driver->event_record(f.event, f.stream->ds);
      pending_user_frees_.push_back(f);
    }
  }
  arena_->recycle(head);
}

void CachingAllocator::user_free(const PendingUserFree& f) {
  rt_.driver->set_device(device_);
  f.allocator.free(f.ptr, f.size, device_, rt_.driver->stream_native_handle(f.stream->ds));
}

void CachingAllocator::check_allocator_unused() const {
  ACCEL_RT_CHECK(stats_.num_device_alloc == 0, InvalidValueError, "the allocator of device ",
                 device_, " cannot change: it already allocated ", stats_.num_device_alloc,
                 " segment(s) of device memory (change it before the first allocation, at the "
                 "start of the process)");
}

void CachingAllocator::check_allocator_can_change() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_allocator_unused();
}

void CachingAllocator::set_allocator(SegmentAllocator allocator) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_allocator_unused();
  allocator_ = allocator;
  small_->allocator = large_->allocator = allocator;
}

SegmentAllocator CachingAllocator::allocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocator_;
}

}  // namespace accel::rt::detail
