// Expandable segments (PyTorch's expandable_segments): each stream's allocations of a default
// pool grow one reserved range of device addresses, memory mapped behind it as needed, so that
// blocks freed next to each other merge however their sizes varied, instead of each size class
// holding segments of its own. Needs the driver's virtual memory (Driver::va_*).
#include <algorithm>

#include "runtime/allocator_blocks.h"
#include "runtime/allocator_maps.h"
#include "runtime/caching_allocator.h"

namespace accel::rt::detail {
namespace {

Block* last_block(Block* head) {
  Block* b = head;
  while (b != nullptr && b->next != nullptr) b = b->next;
  return b;
}

bool is_cached(const Block* b) {
  return b != nullptr && !b->allocated && b->in_bin && b->event_count == 0;
}

}  // namespace

bool CachingAllocator::expands(BlockPool& pool, const StreamObj& stream) {
  return settings_.expandable_segments && rt_.capabilities.virtual_memory && !pool.is_private &&
         pool.allocator.is_driver() && !stream.capturing.load(std::memory_order_acquire) &&
         !pool.expandable(stream.slot).unavailable;
}

Block* CachingAllocator::grow_expandable(BlockPool& pool, StreamObj& stream, std::size_t rounded) {
  Expandable& e = pool.expandable(stream.slot);
  if (e.base == nullptr) {
    check_new_memory(rounded, stream);
    e.granularity = rt_.driver->va_granularity(device_);
    e.reserved = round_up(device_total(), e.granularity);
    e.base = static_cast<char*>(rt_.driver->va_reserve(device_, e.reserved));
    if (e.base == nullptr) {
      e.unavailable = true;
      return nullptr;
    }
  }
  Block* tail = last_block(e.head);
  const std::size_t free_tail = is_cached(tail) ? tail->size : 0;
  const std::size_t grow = round_up(rounded - std::min(rounded, free_tail), e.granularity);
  const auto reserved_now = static_cast<std::size_t>(stats_.reserved_bytes[kAggregate].current);
  if (e.mapped + grow > e.reserved ||
      (reserve_limit_ != 0 && reserved_now + grow > reserve_limit_)) {
    return nullptr;
  }
  char* at = e.base + e.mapped;
  if (grow > 0) {
    check_new_memory(grow, stream);
    if (!rt_.driver->va_map(device_, at, grow)) return nullptr;
    e.mapped += grow;
    update_stat(stats_.reserved_bytes, pool.small, static_cast<int64_t>(grow));
    ++stats_.num_device_alloc;
    record_trace(TraceEntry::Action::SegmentMap, reinterpret_cast<uint64_t>(at), grow, &stream,
                 pool.id, nullptr);
  }
  Block* b = nullptr;
  if (free_tail > 0) {
    pool.bins_of(tail).remove(tail);
    add_inactive_split(tail, -1);
    tail->size += grow;
    b = tail;
  } else {
    b = arena_->make();
    b->ptr = at;
    b->size = grow;
    b->stream = &stream;
    b->pool = &pool;
    b->prev = tail;
    if (tail != nullptr) {
      tail->next = b;
    } else {  // the segment's first block
      b->expandable = &e;
      e.head = b;
      segments_[b->addr()] = b;
      ++pool.segments;
      update_stat(stats_.segment, pool.small, 1);
    }
  }
  e.head->segment_size = e.mapped;
  return b;
}

bool CachingAllocator::shrink_expandable(Expandable& e) {
  if (kept(e.head)) return false;  // a graph may write anywhere in it
  Block* tail = last_block(e.head);
  if (!is_cached(tail)) return false;
  const std::size_t offset = static_cast<std::size_t>(static_cast<char*>(tail->ptr) - e.base);
  const std::size_t cut = round_up(offset, e.granularity);  // pages wholly in the free tail
  if (cut >= e.mapped) return false;
  BlockPool& pool = *tail->pool;
  StreamObj* owner = tail->stream;
  pool.bins_of(tail).remove(tail);
  add_inactive_split(tail, -1);
  const std::size_t unmapped = e.mapped - cut;
  tail->size -= unmapped;
  if (tail->size == 0) {
    if (tail->prev != nullptr) {
      tail->prev->next = nullptr;
    } else {  // nothing left mapped: the segment goes
      segments_.erase(tail->addr());
      --pool.segments;
      update_stat(stats_.segment, pool.small, -1);
      e.head = nullptr;
    }
    arena_->recycle(tail);
  } else {
    pool.bins_of(tail).insert(tail);
    add_inactive_split(tail, +1);
  }
  rt_.driver->va_unmap(device_, e.base + cut, unmapped);
  e.mapped = cut;
  if (e.head != nullptr) e.head->segment_size = e.mapped;
  update_stat(stats_.reserved_bytes, pool.small, -static_cast<int64_t>(unmapped));
  ++stats_.num_device_free;
  record_trace(TraceEntry::Action::SegmentUnmap, reinterpret_cast<uint64_t>(e.base + cut), unmapped,
               owner, pool.id, nullptr);
  if (e.mapped == 0) {  // the addresses go back too; a later allocation reserves again
    rt_.driver->va_release(device_, e.base, e.reserved);
    e = Expandable{};
  }
  return true;
}

}  // namespace accel::rt::detail
