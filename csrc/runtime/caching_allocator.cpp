#include "runtime/caching_allocator.h"

#include "runtime/allocator_blocks.h"
#include "runtime/allocator_maps.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <limits>
#include <utility>

namespace accel::rt::detail {

// --- the allocator ------------------------------------------------------------------------

CachingAllocator::CachingAllocator(Runtime& rt, int device)
    : rt_(rt),
      device_(device),
      small_(std::make_unique<BlockPool>()),
      large_(std::make_unique<BlockPool>()),
      allocated_(std::make_unique<PtrMap>()),
      arena_(std::make_unique<BlockArena>()) {
  small_->small = true;
  large_->small = false;
}

CachingAllocator::~CachingAllocator() = default;

BlockPool& CachingAllocator::pool_for(PoolId id, bool small) {
  if (id.is_default()) return small ? *small_ : *large_;
  auto& p = private_pools_[id];
  if (!p) {
    p = std::make_unique<PrivatePool>();
    for (BlockPool* bp : {&p->small, &p->large}) {
      bp->id = id;
      bp->is_private = true;
      bp->use_count = &p->use_count;
    }
    p->small.small = true;
    p->large.small = false;
    p->small.allocator = p->large.allocator = allocator_;
  }
  return small ? p->small : p->large;
}

void CachingAllocator::add_active(Block* b, int sign) {
  update_stat(stats_.active, b->pool->small, sign);
  update_stat(stats_.active_bytes, b->pool->small, sign * static_cast<int64_t>(b->size));
}

void CachingAllocator::add_inactive_split(Block* b, int sign) {
  if (!b->is_split()) return;
  update_stat(stats_.inactive_split, b->pool->small, sign);
  update_stat(stats_.inactive_split_bytes, b->pool->small, sign * static_cast<int64_t>(b->size));
}

void CachingAllocator::check_new_memory(std::size_t size, StreamObj& stream) {
  rt_.check_unsafe_call(
      detail::concat("allocating ", size, " bytes of new device memory for ",
                     detail::describe(stream.handle())),
      "the cache had no free block and new device memory is a synchronizing driver call "
      "(allocate it before the capture, or capture with capture_error_mode=\"thread_local\" "
      "or \"relaxed\")");
}

std::size_t CachingAllocator::device_total() {
  if (device_total_ == 0) device_total_ = rt_.driver->mem_get_info(device_).total;
  return device_total_;
}

void CachingAllocator::split_block(Block* b, std::size_t size) {
  if (b->pool->no_split) return;
  const std::size_t rest = b->size - size;
  if (!splits(*b->pool, size, rest)) return;
  Block* r = arena_->make();
  r->ptr = static_cast<char*>(b->ptr) + size;
  r->size = rest;
  r->stream = b->stream;
  r->pool = b->pool;
  r->prev = b;
  r->next = b->next;
  if (r->next != nullptr) r->next->prev = r;
  b->next = r;
  b->size = size;
  b->pool->bins_of(r).insert(r);
  add_inactive_split(r, +1);
}

Block* CachingAllocator::try_allocate(BlockPool& pool, StreamObj& stream, std::size_t rounded,
                                      bool uncached) {
  if (uncached) {  // a segment of its own, never split
    garbage_collect(pool, rounded);
    Block* b = alloc_segment(pool, stream, rounded);
    if (b != nullptr) b->uncached = true;
    return b;
  }
  Bins& bins = pool.bins(stream.slot);
  Block* b = bins.find(rounded, largest_fit(pool, rounded));
  if (b != nullptr) {
    bins.remove(b);
    add_inactive_split(b, -1);
  } else {
    if (expands(pool, stream)) {
      b = grow_expandable(pool, stream, rounded);
      // nullptr: no memory to map, unless the reservation was just refused (then classic).
      if (b == nullptr && !pool.expandable(stream.slot).unavailable) return nullptr;
    }
    if (b == nullptr) {
      garbage_collect(pool, segment_size_for(rounded));
      b = alloc_segment(pool, stream, segment_size_for(rounded));
      if (b == nullptr) return nullptr;
    }
  }
  split_block(b, rounded);
  return b;
}

void* CachingAllocator::malloc(std::size_t size, StreamObj& stream) {
  if (size == 0) return nullptr;
  ACCEL_RT_CHECK(size <= std::numeric_limits<int64_t>::max(), InvalidValueError, "malloc: ", size,
                 " bytes is not a valid size (a negative size converted to unsigned)");
  if (size > kMaxRequest) {
    // Larger than any device (a tensor of 2**60 elements): out of memory, as on CUDA, before
    // the rounding below could overflow.
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_ooms;
    throw_oom(size, size);
  }
  PoolId pool_id =
      stream.capturing.load(std::memory_order_acquire) ? rt_.capture_pool(stream) : PoolId{};
  std::shared_ptr<HistoryContext> ctx;
  ContextRecorder recorder;
  std::unique_lock<std::mutex> lock(mutex_);
  const std::size_t rounded = round_request(size);  // the settings are read under the lock
  const bool small = rounded <= kSmallSize;
  if (history_enabled_ && recorder_) {
    recorder = recorder_;
    lock.unlock();
    ctx = recorder();  // may be slow (stack traces): outside the lock
    lock.lock();
  }
  if (pool_id.is_default() && !thread_pools_.empty()) {
    const std::thread::id me = std::this_thread::get_id();
    for (auto it = thread_pools_.rbegin(); it != thread_pools_.rend(); ++it) {
      if (it->second == me) {
        pool_id = it->first;
        break;
      }
    }
  }
  // While a capture is underway no event is queried and no memory freed (CUDA forbids both).
  const bool capturing = rt_.capturing_anywhere();
  if ((!pending_events_.empty() || !pending_user_frees_.empty()) && !capturing) process_events();
  const bool uncached =
      (!caching_ || !allocator_.is_driver()) && pool_id.is_default() && !capturing;

  Block* b = try_allocate(pool_for(pool_id, small), stream, rounded, uncached);
  if (b == nullptr && !capturing) {
    // Out of device memory: return every cached segment to the driver and retry once.
    ++stats_.num_alloc_retries;
    release_cached_segments();
    b = try_allocate(pool_for(pool_id, small), stream, rounded, uncached);
    // After memory was freed elsewhere: completed frees count, the cache goes back, retry.
    const auto retry = [&] {
      process_events();
      release_cached_segments();
      return try_allocate(pool_for(pool_id, small), stream, rounded, uncached);
    };
    if (b == nullptr) {
      // Memory still held by work in flight (pending record_stream events, driver frees
      // waiting for streams): wait for the device without holding the lock, then retry.
      lock.unlock();
      rt_.synchronize_streams(device_, false);
      lock.lock();
      ++stats_.num_sync_all_streams;
      b = retry();
    }
    if (b == nullptr) {
      // Memory held elsewhere on the device (another library's cache): the hooks may free it.
      lock.unlock();
      const bool freed = relieve_memory_pressure(device_, size);
      lock.lock();
      if (freed) b = retry();
    }
  }
  if (b == nullptr && pool_id.is_default()) {
    // Pools made with use_on_oom lend their free blocks as a last resort.
    for (auto& [id, p] : private_pools_) {
      if (!p->use_on_oom || p->use_count == 0) continue;
      BlockPool& pool = small ? p->small : p->large;
      Bins& bins = pool.bins(stream.slot);
      b = bins.find(rounded, largest_fit(pool, rounded));
      if (b == nullptr) continue;
      bins.remove(b);
      add_inactive_split(b, -1);
      split_block(b, rounded);
      break;
    }
  }
  if (b == nullptr) {
    ++stats_.num_ooms;
    // As in CUDA's traces, an oom entry's address is the device's free memory.
    record_trace(TraceEntry::Action::Oom, rt_.driver->mem_get_info(device_).free, size, &stream,
                 pool_id, ctx);
    throw_oom(size, segment_size_for(rounded));
  }

  b->allocated = true;
  b->requested = size;
  b->context = ctx;
  allocated_->insert(b->addr(), b);
  update_stat(stats_.allocation, small, 1);
  update_stat(stats_.allocated_bytes, small, static_cast<int64_t>(b->size));
  update_stat(stats_.requested_bytes, small, static_cast<int64_t>(size));
  if (oversize(b->size)) update_stat(stats_.oversize_allocations, 1);
  add_active(b, +1);
  if (history_enabled_) {
    record_trace(TraceEntry::Action::Alloc, b->addr(), b->size, &stream, b->pool->id,
                 std::move(ctx));
  }
  return b->ptr;
}

bool CachingAllocator::free(void* ptr) {
  std::unique_lock<std::mutex> lock(mutex_);
  Block* b = allocated_->erase(reinterpret_cast<uintptr_t>(ptr));
  if (b == nullptr) return false;
  std::shared_ptr<HistoryContext> freed_by;  // the free's own context (history level All)
  if (history_enabled_ && context_level_ == ContextLevel::All && recorder_) {
    // May be slow (stack traces): outside the lock. The block is this call's now, and still
    // marked allocated, so nothing merges it or releases its segment meanwhile.
    const ContextRecorder recorder = recorder_;
    lock.unlock();
    freed_by = recorder();
    lock.lock();
  }
  b->allocated = false;
  const bool small = b->pool->small;
  update_stat(stats_.allocation, small, -1);
  update_stat(stats_.allocated_bytes, small, -static_cast<int64_t>(b->size));
  update_stat(stats_.requested_bytes, small, -static_cast<int64_t>(b->requested));
  if (oversize(b->size)) update_stat(stats_.oversize_allocations, -1);
  if (history_enabled_) {
    record_trace(TraceEntry::Action::FreeRequested, b->addr(), b->size, b->stream, b->pool->id,
                 freed_by ? freed_by : b->context);
  }
  if (b->stream_uses.empty()) {
    free_block(b, freed_by);
    return true;
  }
  // Recording an event on a capturing stream (of any device) would put it into the graph:
  // such frees wait until the capture ends (capture_ended) before their events are recorded.
  for (Stream s : b->stream_uses) {
    StreamObj* obj = rt_.devices[s.device()]->streams.get(s.slot());
    if (obj != nullptr && obj->capturing.load(std::memory_order_acquire)) {
      deferred_frees_.push_back(b);
      return true;
    }
  }
  insert_events(b);
  return true;
}

void CachingAllocator::insert_events(Block* b) {
  for (Stream s : b->stream_uses) {
    StreamObj* obj = rt_.devices[s.device()]->streams.get(s.slot());
    // A stream destroyed since has finished all its work: nothing to wait for.
    if (obj == nullptr || !obj->matches(s.generation())) continue;
    DriverEvent ev = rt_.pool_event(obj->device);
    rt_.driver->event_record(ev, obj->ds);
    pending_events_.push_back(PendingEvent{ev, obj->device, b});
    ++b->event_count;
  }
  b->stream_uses.clear();
  if (b->event_count == 0) free_block(b);
}

void CachingAllocator::process_events() {
  std::vector<Block*> ready;
  std::size_t kept = 0;
  for (PendingEvent& pe : pending_events_) {
    if (rt_.driver->event_query(pe.event)) {
      rt_.return_event(pe.device, pe.event);
      if (--pe.block->event_count == 0) ready.push_back(pe.block);
    } else {
      pending_events_[kept++] = pe;
    }
  }
  pending_events_.resize(kept);
  for (Block* b : ready) free_block(b);
  kept = 0;
  for (PendingUserFree& f : pending_user_frees_) {
    if (rt_.driver->event_query(f.event)) {
      rt_.return_event(device_, f.event);
      user_free(f);
    } else {
      pending_user_frees_[kept++] = f;
    }
  }
  pending_user_frees_.resize(kept);
}

void CachingAllocator::capture_ended() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block*> blocks;
  blocks.swap(deferred_frees_);
  for (Block* b : blocks) insert_events(b);
}

void CachingAllocator::free_block(Block* b, const std::shared_ptr<HistoryContext>& freed_by) {
  add_active(b, -1);
  BlockPool& pool = *b->pool;
  Bins& bins = pool.bins_of(b);
  if (history_enabled_) {
    // Before the merge below: the entry names the block its alloc entry named.
    record_trace(TraceEntry::Action::FreeCompleted, b->addr(), b->size, b->stream, pool.id,
                 freed_by ? freed_by : b->context);
  }
  // Merge with free neighbours of the same segment.
  for (Block* n : {b->prev, b->next}) {
    if (n == nullptr || n->allocated || n->event_count > 0 || !n->in_bin) continue;
    bins.remove(n);
    add_inactive_split(n, -1);
    if (n == b->prev) {
      b->ptr = n->ptr;
      b->size += n->size;
      b->prev = n->prev;
      if (b->prev != nullptr) b->prev->next = b;
      b->segment_size = n->segment_size;
      b->expandable = n->expandable;
      if (b->prev == nullptr) segments_[b->addr()] = b;
      if (b->expandable != nullptr) b->expandable->head = b;
    } else {
      b->size += n->size;
      b->next = n->next;
      if (b->next != nullptr) b->next->prev = b;
    }
    arena_->recycle(n);
  }
  b->requested = 0;
  b->context.reset();
  b->freed_at = ++free_seq_;
  bins.insert(b);
  add_inactive_split(b, +1);
  // Allocated with caching off: back to the driver (kept as cache if a capture is underway,
  // when no memory may be freed).
  if (std::exchange(b->uncached, false) && !rt_.capturing_anywhere() && !kept(b)) {
    release_segment(b);
    return;
  }
  // A block of a private pool nobody holds stays cached, as CUDA's: a graph captured later may
  // still write to it (a tensor of an earlier capture's pool used in a new capture, then freed),
  // so its segment goes back to the driver at empty_cache or when an allocation runs out of
  // memory, not at once.
}

bool CachingAllocator::segment_releasable(const Block* head) const {
  return head->next == nullptr && !head->allocated && head->event_count == 0 && head->in_bin &&
         !kept(head);
}

bool CachingAllocator::kept(const Block* head) const {
  return !kept_.empty() && kept_.count(head->addr()) > 0;
}

uintptr_t CachingAllocator::keep_segment(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Block* head = segment_of(ptr);
  if (head == nullptr) return 0;
  ++kept_[head->addr()];
  return head->addr();
}

void CachingAllocator::unkeep_segments(const std::vector<uintptr_t>& bases) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (uintptr_t base : bases) {
    auto it = kept_.find(base);
    if (it != kept_.end() && --it->second == 0) kept_.erase(it);
  }
  // A segment free by now stays cached: the next empty_cache or out-of-memory retry releases it.
}

template <class Releasable>
bool CachingAllocator::release_free_segments(Releasable releasable) {
  bool released = false;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = it->second;
    ++it;                               // release_segment erases the current entry
    if (head->expandable != nullptr) {  // its free end is unmapped
      if (releasable(*head->pool) && shrink_expandable(*head->expandable)) released = true;
      continue;
    }
    if (releasable(*head->pool) && segment_releasable(head)) {
      release_segment(head);
      released = true;
    }
  }
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    PrivatePool& p = *it->second;
    ++it;  // maybe_drop_private_pool erases the current entry
    maybe_drop_private_pool(&p.small);
  }
  return released;
}

bool CachingAllocator::release_cached_segments() {
  // Not the private pools that graphs or MemPools still hold: they replay into them.
  return release_free_segments(
      [](const BlockPool& p) { return !p.is_private || *p.use_count == 0; });
}

void CachingAllocator::maybe_drop_private_pool(BlockPool* pool) {
  if (!pool->is_private || *pool->use_count > 0) return;
  auto it = private_pools_.find(pool->id);
  if (it == private_pools_.end()) return;
  if (it->second->small.segments == 0 && it->second->large.segments == 0) {
    private_pools_.erase(it);
  }
}

void CachingAllocator::use_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& pool = pool_for(id, true);
  ++*pool.use_count;
}

void CachingAllocator::release_pool(PoolId id, bool empty_now) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end() || it->second->use_count == 0) return;
  if (--it->second->use_count > 0) return;
  // Nobody holds the pool: empty_cache and out-of-memory retries may release its free segments
  // (as CUDA's graph_pools_freeable). A MemPool let go releases those free now (CUDA's
  // ~MemPool empties its pool's cache); not during a capture, which frees nothing.
  if (!empty_now || rt_.capturing_anywhere()) return;
  release_free_segments([&](const BlockPool& p) { return p.is_private && p.id == id; });
}

void CachingAllocator::create_pool(PoolId id, MemPoolOptions options) {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_for(id, true);
  PrivatePool& p = *private_pools_.at(id);
  p.use_on_oom = options.use_on_oom;
  p.small.no_split = p.large.no_split = options.no_split;
  if (!options.allocator.is_driver()) p.small.allocator = p.large.allocator = options.allocator;
  ++p.use_count;
}

int CachingAllocator::pool_use_count(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_pools_.find(id);
  return it == private_pools_.end() ? 0 : it->second->use_count;
}

void CachingAllocator::begin_allocate_to_pool(PoolId id, std::thread::id thread) {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_for(id, true);
  ++private_pools_.at(id)->use_count;
  thread_pools_.emplace_back(id, thread);
}

void CachingAllocator::end_allocate_to_pool(PoolId id, std::thread::id thread) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find(thread_pools_.rbegin(), thread_pools_.rend(), std::make_pair(id, thread));
    ACCEL_RT_CHECK(it != thread_pools_.rend(), InvalidValueError,
                   "mem_pool_end_allocate: this thread is not allocating to pool (", id.first, ", ",
                   id.second, ") on device ", device_);
    thread_pools_.erase(std::next(it).base());
  }
  release_pool(id);
}

void CachingAllocator::set_caching(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  caching_ = enabled;
}

bool CachingAllocator::caching() {
  std::lock_guard<std::mutex> lock(mutex_);
  return caching_ && allocator_.is_driver();
}

void CachingAllocator::empty_cache() {
  // During a capture nothing is freed (CUDA forbids frees then); the cache stays as it is.
  if (rt_.capturing_anywhere()) return;
  rt_.synchronize_streams(device_, false);
  std::lock_guard<std::mutex> lock(mutex_);
  process_events();
  release_cached_segments();
}

Block* CachingAllocator::segment_of(const void* ptr) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = segments_.upper_bound(p);
  if (it == segments_.begin()) return nullptr;
  --it;
  Block* head = it->second;
  return p < head->addr() + head->segment_size ? head : nullptr;
}

bool CachingAllocator::owns(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  return segment_of(ptr) != nullptr;
}

std::pair<void*, std::size_t> CachingAllocator::allocation_containing(const void* ptr,
                                                                      bool* freed) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Block* b = allocated_->find(reinterpret_cast<uintptr_t>(ptr))) {
    return {b->ptr, b->requested};
  }
  Block* head = segment_of(ptr);
  if (head == nullptr) return {nullptr, 0};
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (Block* b = head; b != nullptr; b = b->next) {
    if (p >= b->addr() && p < b->addr() + b->size) {
      if (b->allocated && p < b->addr() + b->requested) return {b->ptr, b->requested};
      break;
    }
  }
  if (freed != nullptr) *freed = true;
  return {nullptr, 0};
}

bool CachingAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = allocated_->find(reinterpret_cast<uintptr_t>(ptr));
  if (b == nullptr) return false;
  if (stream == b->stream->handle()) return true;  // its own stream: stream order suffices
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
  return true;
}

}  // namespace accel::rt::detail
