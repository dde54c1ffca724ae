// The caching allocator's statistics, memory limit, out-of-memory report, history and
// snapshot.
#include <string>

#include "runtime/allocator_blocks.h"
#include "runtime/caching_allocator.h"

namespace accel::rt::detail {

DeviceStats CachingAllocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& s : *a) s.peak = s.current;
  }
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& s : *a) s.allocated = s.freed = 0;
  }
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_sync_all_streams = 0;
  stats_.num_device_alloc = stats_.num_device_free = 0;
}

void CachingAllocator::set_reserve_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserve_limit_ = bytes;
}

std::size_t CachingAllocator::reserve_limit() {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserve_limit_;
}

[[noreturn]] void CachingAllocator::throw_oom(std::size_t size, std::size_t alloc_size) {
  const MemoryInfo info = rt_.driver->mem_get_info(device_);
  const int64_t allocated = stats_.allocated_bytes[kAggregate].current;
  const int64_t reserved = stats_.reserved_bytes[kAggregate].current;
  std::string hint;
  if (reserve_limit_ != 0) {
    hint += " The per-process memory fraction limits this process to " +
            format_bytes(reserve_limit_) + " of the device (set_per_process_memory_fraction).";
  }
  if (const std::string driver_hint = rt_.driver->oom_hint(); !driver_hint.empty()) {
    hint += " " + driver_hint;
  }
  // "<device> out of memory. Tried to allocate", as CUDA and XPU word it: libraries that recover
  // from running out of memory (Accelerate's find_executable_batch_size, transformers'
  // auto_find_batch_size) recognize the error by these words.
  if (reserved - allocated >= static_cast<int64_t>(size)) {
    hint +=
        " Reserved but unallocated memory could hold the request but is fragmented: "
        "PYTORCH_ALLOC_CONF=max_split_size_mb:<MB> (or garbage_collection_threshold:<share>) "
        "may help.";
  }
  ACCEL_RT_THROW(OutOfMemoryError, "accel out of memory. Tried to allocate ", format_bytes(size),
                 " (", size, " bytes; a new segment of ", format_bytes(alloc_size),
                 " was needed) on device ", device_, ". The device has a total capacity of ",
                 format_bytes(info.total), ", of which ", format_bytes(info.free),
                 " is free. The caching allocator has ",
                 format_bytes(static_cast<uint64_t>(allocated)), " allocated and ",
                 format_bytes(static_cast<uint64_t>(reserved)), " reserved (",
                 format_bytes(static_cast<uint64_t>(reserved - allocated)),
                 " reserved but unallocated). Free memory you no longer need or use smaller "
                 "sizes.",
                 hint);
}

// --- history ------------------------------------------------------------------------------

void CachingAllocator::set_history(bool enabled, ContextRecorder recorder, std::size_t max_entries,
                                   ContextLevel level) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_enabled_ = enabled;
  recorder_ = enabled ? std::move(recorder) : ContextRecorder{};
  context_level_ = level;
  history_max_ = max_entries;
  if (!enabled) history_.clear();
  while (history_.size() > history_max_) history_.pop_front();
}

void CachingAllocator::record_trace(TraceEntry::Action action, uint64_t addr, uint64_t size,
                                    const StreamObj* s, PoolId pool,
                                    std::shared_ptr<HistoryContext> ctx) {
  if (!history_enabled_ || history_max_ == 0) return;
  TraceEntry e;
  e.action = action;
  e.device = device_;
  e.addr = addr;
  e.size = size;
  e.stream = s != nullptr ? s->handle().bits() : 0;
  e.time_us = now_us();
  e.pool = pool;
  // As CUDA's: at level State the trace keeps no context (the blocks of a snapshot do).
  if (context_level_ != ContextLevel::State) e.context = std::move(ctx);
  history_.push_back(std::move(e));
  if (history_.size() > history_max_) history_.pop_front();
}

void CachingAllocator::snapshot(MemorySnapshot& out) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [addr, head] : segments_) {
    SegmentInfo seg;
    seg.device = device_;
    seg.addr = addr;
    seg.total_size = head->segment_size;
    seg.stream = head->stream->handle().bits();
    seg.is_large = !head->pool->small;
    seg.is_expandable = head->expandable != nullptr;
    seg.pool = head->pool->id;
    for (const Block* b = head; b != nullptr; b = b->next) {
      BlockInfo bi;
      bi.addr = b->addr();
      bi.size = b->size;
      bi.requested_size = b->requested;
      bi.context = b->context;
      if (b->allocated) {
        bi.state = BlockInfo::State::ActiveAllocated;
        seg.allocated_size += b->size;
        seg.active_size += b->size;
        seg.requested_size += b->requested;
      } else if (!b->in_bin) {
        bi.state = BlockInfo::State::ActivePendingFree;
        seg.active_size += b->size;
      } else {
        bi.state = BlockInfo::State::Inactive;
      }
      seg.blocks.push_back(std::move(bi));
    }
    out.segments.push_back(std::move(seg));
  }
  out.device_traces.emplace_back(history_.begin(), history_.end());
}

}  // namespace accel::rt::detail
