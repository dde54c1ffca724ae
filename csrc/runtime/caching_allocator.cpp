#include "runtime/caching_allocator.h"

#include <algorithm>
#include <bit>
#include <chrono>

namespace accel::rt::detail {

// --- blocks and bins ----------------------------------------------------------------------

struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;
  StreamObj* stream = nullptr;  // the allocating stream (stream objects are never freed)
  BlockPool* pool = nullptr;
  Block* prev = nullptr;  // neighbours inside the segment, by address
  Block* next = nullptr;
  Block* bin_prev = nullptr;
  Block* bin_next = nullptr;
  uint32_t bin = 0;
  bool allocated = false;
  bool in_bin = false;
  int event_count = 0;
  std::size_t segment_size = 0;  // set on segment heads
  std::vector<Stream> stream_uses;
  std::shared_ptr<HistoryContext> context;

  bool is_split() const { return prev != nullptr || next != nullptr; }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(ptr); }
};

namespace {

constexpr int kSLBits = 4;
constexpr uint32_t kSL = 1u << kSLBits;
constexpr uint32_t kFL = 48;
constexpr std::size_t kUnit = CachingAllocator::kMinBlockSize;
// Blocks of the request's own size class that are examined before moving up a class.
constexpr int kOwnBinProbe = 8;

void mapping(std::size_t units, uint32_t& fl, uint32_t& sl) {
  if (units < kSL) {
    fl = 0;
    sl = static_cast<uint32_t>(units);
  } else {
    const int msb = 63 - std::countl_zero(static_cast<uint64_t>(units));
    fl = static_cast<uint32_t>(msb - kSLBits + 1);
    sl = static_cast<uint32_t>((units >> (msb - kSLBits)) - kSL);
  }
}

std::size_t round_size(std::size_t size) {
  return size < kUnit ? kUnit : (size + kUnit - 1) / kUnit * kUnit;
}

std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= CachingAllocator::kSmallSize) return CachingAllocator::kSmallBuffer;
  if (rounded < CachingAllocator::kMinLargeAlloc) return CachingAllocator::kLargeBuffer;
  const std::size_t r = CachingAllocator::kRoundLarge;
  return (rounded + r - 1) / r * r;
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void update_stat(Stat& s, int64_t delta) {
  s.current += delta;
  if (s.current > s.peak) s.peak = s.current;
  if (delta > 0) s.allocated += delta;
  if (delta < 0) s.freed -= delta;
}

void update_stat(StatArray& a, bool small, int64_t delta) {
  update_stat(a[kAggregate], delta);
  update_stat(a[small ? kSmallPool : kLargePool], delta);
}

}  // namespace

// Free blocks of one stream, in segregated size classes.
struct Bins {
  uint64_t fl_map = 0;
  std::array<uint32_t, kFL> sl_map{};
  std::array<Block*, kFL * kSL> heads{};

  void insert(Block* b) {
    uint32_t fl, sl;
    mapping(b->size / kUnit, fl, sl);
    const uint32_t idx = fl * kSL + sl;
    b->bin = idx;
    b->bin_prev = nullptr;
    b->bin_next = heads[idx];
    if (heads[idx] != nullptr) heads[idx]->bin_prev = b;
    heads[idx] = b;
    sl_map[fl] |= 1u << sl;
    fl_map |= uint64_t{1} << fl;
    b->in_bin = true;
  }

  void remove(Block* b) {
    const uint32_t idx = b->bin;
    if (b->bin_prev != nullptr) {
      b->bin_prev->bin_next = b->bin_next;
    } else {
      heads[idx] = b->bin_next;
    }
    if (b->bin_next != nullptr) b->bin_next->bin_prev = b->bin_prev;
    if (heads[idx] == nullptr) {
      const uint32_t fl = idx / kSL;
      sl_map[fl] &= ~(1u << (idx % kSL));
      if (sl_map[fl] == 0) fl_map &= ~(uint64_t{1} << fl);
    }
    b->bin_prev = b->bin_next = nullptr;
    b->in_bin = false;
  }

  // A free block of at least `size` bytes, or nullptr.
  Block* find(std::size_t size) {
    uint32_t fl, sl;
    mapping(size / kUnit, fl, sl);
    int probe = 0;
    for (Block* b = heads[fl * kSL + sl]; b != nullptr && probe < kOwnBinProbe;
         b = b->bin_next, ++probe) {
      if (b->size >= size) return b;
    }
    // Every block of a higher class is large enough.
    const uint32_t sl_bits = sl + 1 < kSL ? sl_map[fl] & (~0u << (sl + 1)) : 0;
    if (sl_bits != 0) return heads[fl * kSL + std::countr_zero(sl_bits)];
    const uint64_t fl_bits = fl + 1 < kFL ? fl_map & (~uint64_t{0} << (fl + 1)) : 0;
    if (fl_bits == 0) return nullptr;
    const uint32_t fl2 = static_cast<uint32_t>(std::countr_zero(fl_bits));
    return heads[fl2 * kSL + std::countr_zero(sl_map[fl2])];
  }
};

struct BlockPool {
  bool small = true;
  PoolId id;
  bool is_private = false;
  int* use_count = nullptr;  // the private pool's holders
  std::size_t segments = 0;
  std::vector<std::unique_ptr<Bins>> by_slot;

  Bins& bins(uint32_t slot) {
    if (slot >= by_slot.size()) by_slot.resize(std::max<std::size_t>(slot + 1, 8));
    auto& b = by_slot[slot];
    if (!b) b = std::make_unique<Bins>();
    return *b;
  }
  Bins& bins_of(const Block* b) { return bins(b->stream->slot); }
};

struct CachingAllocator::PrivatePool {
  int use_count = 0;
  BlockPool small;
  BlockPool large;
};

// Pointer -> allocated block: open addressing with linear probing and backward-shift deletion.
class CachingAllocator::PtrMap {
 public:
  PtrMap() { rehash(1024); }

  void insert(uintptr_t key, Block* value) {
    if ((count_ + 1) * 4 > keys_.size() * 3) rehash(keys_.size() * 2);
    std::size_t i = home(key);
    while (keys_[i] != 0) i = (i + 1) & mask_;
    keys_[i] = key;
    values_[i] = value;
    ++count_;
  }

  Block* find(uintptr_t key) const {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == 0) return nullptr;
    }
  }

  Block* erase(uintptr_t key) {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (keys_[i] == 0) return nullptr;
      if (keys_[i] == key) break;
    }
    Block* value = values_[i];
    for (std::size_t j = (i + 1) & mask_; keys_[j] != 0; j = (j + 1) & mask_) {
      // Move the entry at j into the hole at i unless its home lies cyclically in (i, j].
      const std::size_t h = home(keys_[j]);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        keys_[i] = keys_[j];
        values_[i] = values_[j];
        i = j;
      }
    }
    keys_[i] = 0;
    --count_;
    return value;
  }

 private:
  std::size_t home(uintptr_t key) const {
    return static_cast<std::size_t>(((key >> 9) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void rehash(std::size_t capacity) {
    std::vector<uintptr_t> old_keys = std::move(keys_);
    std::vector<Block*> old_values = std::move(values_);
    keys_.assign(capacity, 0);
    values_.assign(capacity, nullptr);
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
    count_ = 0;
    for (std::size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != 0) insert(old_keys[i], old_values[i]);
    }
  }

  std::vector<uintptr_t> keys_;
  std::vector<Block*> values_;
  std::size_t mask_ = 0;
  int shift_ = 0;
  std::size_t count_ = 0;
};

// Block objects are recycled so splitting and merging do not allocate.
class CachingAllocator::BlockArena {
 public:
  Block* make() {
    if (free_.empty()) {
      chunks_.push_back(std::make_unique<Block[]>(kChunk));
      for (std::size_t i = 0; i < kChunk; ++i) free_.push_back(&chunks_.back()[i]);
    }
    Block* b = free_.back();
    free_.pop_back();
    return b;
  }
  void recycle(Block* b) {
    *b = Block{};
    free_.push_back(b);
  }

 private:
  static constexpr std::size_t kChunk = 256;
  std::vector<std::unique_ptr<Block[]>> chunks_;
  std::vector<Block*> free_;
};

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

Block* CachingAllocator::alloc_segment(BlockPool& pool, StreamObj& stream, std::size_t size) {
  if (reserve_limit_ != 0 &&
      static_cast<std::size_t>(stats_.reserved_bytes[kAggregate].current) + size > reserve_limit_) {
    return nullptr;  // the per-process memory fraction is used up
  }
  void* p = rt_.driver->raw_alloc(device_, size);
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
  ++stats_.num_device_alloc;
  record_trace(TraceEntry::Action::SegmentAlloc, b->addr(), size, &stream, pool.id, nullptr);
  return b;
}

void CachingAllocator::split_block(Block* b, std::size_t size) {
  const std::size_t rest = b->size - size;
  const bool worth = b->pool->small ? rest >= kMinBlockSize : rest > kSmallSize;
  if (!worth) return;
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

Block* CachingAllocator::try_allocate(BlockPool& pool, StreamObj& stream, std::size_t rounded) {
  Bins& bins = pool.bins(stream.slot);
  Block* b = bins.find(rounded);
  if (b != nullptr) {
    bins.remove(b);
    add_inactive_split(b, -1);
  } else {
    b = alloc_segment(pool, stream, segment_size_for(rounded));
    if (b == nullptr) return nullptr;
  }
  split_block(b, rounded);
  return b;
}

void* CachingAllocator::malloc(std::size_t size, StreamObj& stream) {
  if (size == 0) return nullptr;
  ACCEL_RT_CHECK(size <= kMaxRequest, InvalidValueError, "malloc: ", size,
                 " bytes is not a valid size (a negative size converted to unsigned, or larger "
                 "than any device)");
  const PoolId pool_id =
      stream.capturing.load(std::memory_order_acquire) ? rt_.capture_pool(stream) : PoolId{};
  const std::size_t rounded = round_size(size);
  const bool small = rounded <= kSmallSize;

  std::shared_ptr<HistoryContext> ctx;
  ContextRecorder recorder;
  std::unique_lock<std::mutex> lock(mutex_);
  if (history_enabled_ && recorder_) {
    recorder = recorder_;
    lock.unlock();
    ctx = recorder();  // may be slow (stack traces): outside the lock
    lock.lock();
  }
  if (!pending_events_.empty()) process_events();

  Block* b = try_allocate(pool_for(pool_id, small), stream, rounded);
  if (b == nullptr) {
    // Out of device memory: return every cached segment to the driver and retry once.
    ++stats_.num_alloc_retries;
    release_cached_segments();
    b = try_allocate(pool_for(pool_id, small), stream, rounded);
    if (b == nullptr && rt_.devices[device_]->captures.load() == 0) {
      // Memory still held by work in flight (pending record_stream events, driver frees
      // waiting for streams): wait for the device without holding the lock, then retry.
      lock.unlock();
      rt_.synchronize_streams(device_, false);
      lock.lock();
      ++stats_.num_sync_all_streams;
      process_events();
      release_cached_segments();
      b = try_allocate(pool_for(pool_id, small), stream, rounded);
    }
    if (b == nullptr) {
      ++stats_.num_ooms;
      // As in CUDA's traces, an oom entry's address is the device's free memory.
      record_trace(TraceEntry::Action::Oom, rt_.driver->mem_get_info(device_).free, size, &stream,
                   pool_id, ctx);
      throw_oom(size, segment_size_for(rounded));
    }
  }

  b->allocated = true;
  b->requested = size;
  b->context = ctx;
  allocated_->insert(b->addr(), b);
  update_stat(stats_.allocation, small, 1);
  update_stat(stats_.allocated_bytes, small, static_cast<int64_t>(b->size));
  update_stat(stats_.requested_bytes, small, static_cast<int64_t>(size));
  add_active(b, +1);
  if (history_enabled_) {
    record_trace(TraceEntry::Action::Alloc, b->addr(), b->size, &stream, b->pool->id,
                 std::move(ctx));
  }
  return b->ptr;
}

bool CachingAllocator::free(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = allocated_->erase(reinterpret_cast<uintptr_t>(ptr));
  if (b == nullptr) return false;
  b->allocated = false;
  const bool small = b->pool->small;
  update_stat(stats_.allocation, small, -1);
  update_stat(stats_.allocated_bytes, small, -static_cast<int64_t>(b->size));
  update_stat(stats_.requested_bytes, small, -static_cast<int64_t>(b->requested));
  if (history_enabled_) {
    record_trace(TraceEntry::Action::FreeRequested, b->addr(), b->size, b->stream, b->pool->id,
                 b->context);
  }
  if (b->stream_uses.empty()) {
    free_block(b);
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
}

void CachingAllocator::capture_ended() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Block*> blocks;
  blocks.swap(deferred_frees_);
  for (Block* b : blocks) insert_events(b);
}

void CachingAllocator::free_block(Block* b) {
  add_active(b, -1);
  BlockPool& pool = *b->pool;
  Bins& bins = pool.bins_of(b);
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
      if (b->prev == nullptr) segments_[b->addr()] = b;
    } else {
      b->size += n->size;
      b->next = n->next;
      if (b->next != nullptr) b->next->prev = b;
    }
    arena_->recycle(n);
  }
  b->requested = 0;
  b->context.reset();
  bins.insert(b);
  add_inactive_split(b, +1);
  if (history_enabled_) {
    record_trace(TraceEntry::Action::FreeCompleted, b->addr(), b->size, b->stream, pool.id,
                 nullptr);
  }
  // A private pool nobody holds gives its memory back as soon as a segment is free.
  if (pool.is_private && *pool.use_count == 0 && !b->is_split()) {
    release_segment(b);
    maybe_drop_private_pool(&pool);
  }
}

bool CachingAllocator::segment_is_free(const Block* head) const {
  return head->next == nullptr && !head->allocated && head->event_count == 0 && head->in_bin;
}

void CachingAllocator::release_segment(Block* head) {
  BlockPool& pool = *head->pool;
  pool.bins_of(head).remove(head);
  segments_.erase(head->addr());
  --pool.segments;
  update_stat(stats_.segment, pool.small, -1);
  update_stat(stats_.reserved_bytes, pool.small, -static_cast<int64_t>(head->segment_size));
  ++stats_.num_device_free;
  record_trace(TraceEntry::Action::SegmentFree, head->addr(), head->segment_size, head->stream,
               pool.id, nullptr);
  rt_.driver->raw_free(device_, head->ptr, head->segment_size);
  arena_->recycle(head);
}

bool CachingAllocator::release_cached_segments() {
  bool released = false;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = it->second;
    ++it;  // release_segment erases the current entry
    const BlockPool& pool = *head->pool;
    if (pool.is_private && *pool.use_count > 0) continue;  // graphs still replay into it
    if (segment_is_free(head)) {
      release_segment(head);
      released = true;
    }
  }
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    PrivatePool& p = *it->second;
    ++it;
    maybe_drop_private_pool(&p.small);
  }
  return released;
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

void CachingAllocator::release_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end() || it->second->use_count == 0) return;
  if (--it->second->use_count > 0) return;
  for (auto sit = segments_.begin(); sit != segments_.end();) {
    Block* head = sit->second;
    ++sit;
    if (head->pool->is_private && head->pool->id == id && segment_is_free(head)) {
      release_segment(head);
    }
  }
  maybe_drop_private_pool(&it->second->small);
}

void CachingAllocator::empty_cache() {
  if (rt_.devices[device_]->captures.load() == 0) rt_.synchronize_streams(device_, false);
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
  if (rt_.driver->name() == "host") {
    hint += " The host driver's device capacity is set by ACCEL_HOST_MEMORY.";
  }
  ACCEL_RT_THROW(OutOfMemoryError, "accel: out of memory on device ", device_,
                 ": tried to allocate ", format_bytes(size), " (", size,
                 " bytes; a new segment of ", format_bytes(alloc_size),
                 " was needed). The device has a total capacity of ", format_bytes(info.total),
                 ", of which ", format_bytes(info.free), " is free. The caching allocator has ",
                 format_bytes(static_cast<uint64_t>(allocated)), " allocated and ",
                 format_bytes(static_cast<uint64_t>(reserved)), " reserved (",
                 format_bytes(static_cast<uint64_t>(reserved - allocated)),
                 " reserved but unallocated). Free memory you no longer need or use smaller "
                 "sizes.",
                 hint);
}

// --- history ------------------------------------------------------------------------------

void CachingAllocator::set_history(bool enabled, ContextRecorder recorder,
                                   std::size_t max_entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  history_enabled_ = enabled;
  recorder_ = enabled ? std::move(recorder) : ContextRecorder{};
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
  e.context = std::move(ctx);
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
