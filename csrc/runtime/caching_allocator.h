// The device caching allocator, written once above the driver.
//
// Sizes are rounded to 512 bytes. Requests up to 1 MiB come from the small pool (2 MiB
// segments); larger ones from the large pool (20 MiB segments below 10 MiB, else the size
// rounded to 2 MiB). Free blocks are cached per stream in segregated size bins (two-level:
// power-of-two classes split in 16 linear sub-classes, with bitmaps), so finding a block and
// returning it are O(1) with no heap allocation. Blocks are split when the remainder is worth
// keeping and merged with free neighbours of the same segment on free.
//
// A block is reused by its own stream as soon as it is freed (stream order makes that safe).
// A block also used by other streams (record_stream) is reused only after events recorded on
// those streams at the time of the free have completed.
//
// With caching off (set_caching(false), ACCEL_NO_MEMORY_CACHING=1: PyTorch's
// PYTORCH_NO_CUDA_MEMORY_CACHING), each allocation of the default pool gets a segment of its own
// that goes back to the driver when freed (once its streams passed the free), so a tool that
// watches driver memory (protected memory, compute-sanitizer) sees every use after free. The
// choice is made per allocation: blocks allocated while caching was on return to the cache.
//
// Segments come from the driver, or from functions the user gives (SegmentAllocator: a MemPool's
// own, or the device's current allocator for every pool, set before the first segment).
//
// Graph captures allocate from private pools (PoolId), kept apart from the default pool so that
// addresses baked into a graph stay valid for every replay. A private pool lives while a graph
// or capture holds it; then, as CUDA's, its free segments go back to the driver at empty_cache
// or when an allocation runs out of memory (at once for a MemPool let go: CUDA's ~MemPool).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/internal.h"

namespace accel::rt::detail {

struct Block;
struct BlockPool;
struct Expandable;

class CachingAllocator {
 public:
  static constexpr std::size_t kMinBlockSize = 512;
  static constexpr std::size_t kSmallSize = std::size_t{1} << 20;       // small pool limit
  static constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;     // small segment
  static constexpr std::size_t kLargeBuffer = std::size_t{20} << 20;    // large segment
  static constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;  // below: kLargeBuffer
  static constexpr std::size_t kRoundLarge = std::size_t{2} << 20;
  // Larger requests are rejected as negative (converted to size_t) or absurd.
  static constexpr std::size_t kMaxRequest = std::size_t{1} << 52;

  CachingAllocator(Runtime& rt, int device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* malloc(std::size_t size, StreamObj& stream);
  // Returns false if ptr is not an allocation start of this device.
  bool free(void* ptr);
  bool record_stream(void* ptr, Stream stream);
  // Does this device own ptr (anywhere inside a segment)?
  bool owns(const void* ptr);
  // The allocated block containing ptr: (start, size), or (nullptr, 0). `freed` is set when ptr
  // lies in device memory that is not currently allocated.
  std::pair<void*, std::size_t> allocation_containing(const void* ptr, bool* freed);

  // The live allocation containing ptr and the segment holding it, for sharing with another
  // process (allocator_segments.cpp): false if ptr is in no live allocation of this device;
  // `why_not` is set when the segment cannot be shared (not the driver's memory).
  struct SegmentView {
    void* alloc = nullptr;  // the allocation's start
    void* base = nullptr;   // the segment's
    std::size_t size = 0;   // the segment's
    const char* why_not = nullptr;
  };
  bool segment_view(const void* ptr, SegmentView* out);

  // Releases cached segments; synchronizes the device first unless a capture is underway.
  void empty_cache();
  DeviceStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();

  // Private pools (graphs, MemPool).
  void use_pool(PoolId id);  // a capture, graph or MemPool holds the pool
  // ... and lets it go; empty_now: a MemPool's last holder, whose pool's free segments go back
  // to the driver at once (a graph's wait for empty_cache or an out-of-memory retry)
  void release_pool(PoolId id, bool empty_now = false);
  void create_pool(PoolId id, MemPoolOptions options);  // a held pool with these options
  int pool_use_count(PoolId id);
  // Allocations of `thread` on streams that are not capturing go to `id` (held meanwhile).
  void begin_allocate_to_pool(PoolId id, std::thread::id thread);
  void end_allocate_to_pool(PoolId id, std::thread::id thread);
  void capture_ended();  // processes frees deferred while a used stream was capturing
  // Graphs keep the segments their captured work uses: a kept segment does not go back to the
  // driver (empty_cache, out-of-memory retries, a pool let go) even once its blocks are free, so
  // a replay after the tensor there was freed writes cached memory, not memory the driver took
  // back. keep_segment: the base of the segment holding `ptr`, now kept once more (0 if `ptr`
  // is no memory of this allocator); unkeep_segments: each base kept once less.
  uintptr_t keep_segment(const void* ptr);
  void unkeep_segments(const std::vector<uintptr_t>& bases);

  // History.
  void set_history(bool enabled, ContextRecorder recorder, std::size_t max_entries,
                   ContextLevel level);
  void snapshot(MemorySnapshot& out);
  // At most `bytes` reserved from the driver (0: no limit): beyond it a new segment fails as if
  // the device were full (set_memory_fraction).
  void set_reserve_limit(std::size_t bytes);
  std::size_t reserve_limit();
  void set_caching(bool enabled);
  bool caching();
  // Segments of the default pools and of pools created from now on come from `allocator`, and
  // the default pools' are no longer cached (set_device_allocator). Only while the device has
  // never had a segment (InvalidValueError otherwise).
  void set_allocator(SegmentAllocator allocator);
  void check_allocator_can_change();  // set_allocator's refusal, without changing anything
  SegmentAllocator allocator();
  // PyTorch's allocator settings (allocator_settings.cpp); validated by the caller.
  void set_settings(const AllocatorSettings& settings);
  AllocatorSettings settings();

 private:
  Block* find_free_block(BlockPool& pool, uint32_t stream_slot, std::size_t size);
  // Settings (allocator_settings.cpp): the rounded size of a request; the largest cached block
  // a request of `rounded` bytes may take from `pool`; whether what remains of a block taken
  // for `rounded` bytes is split off; reclaiming cached segments before reserving `incoming`.
  std::size_t round_request(std::size_t size) const;
  std::size_t largest_fit(const BlockPool& pool, std::size_t rounded) const;
  bool splits(const BlockPool& pool, std::size_t rounded, std::size_t rest) const;
  void garbage_collect(const BlockPool& pool, std::size_t incoming);
  bool oversize(std::size_t size) const { return size >= settings_.max_split_size; }
  void recount_oversize();
  // Expandable segments (allocator_expandable.cpp): whether allocations on `stream` from `pool`
  // grow the stream's expandable segment; a free block of at least `rounded` bytes at its end,
  // out of the bins, after mapping what is missing (nullptr: no memory); unmapping its free end.
  bool expands(BlockPool& pool, const StreamObj& stream);
  Block* grow_expandable(BlockPool& pool, StreamObj& stream, std::size_t rounded);
  bool shrink_expandable(Expandable& e);
  Block* alloc_segment(BlockPool& pool, StreamObj& stream, std::size_t size);
  // A new segment's memory from the pool's allocator (nullptr: none). Refuses memory that
  // overlaps a segment the allocator already has.
  void* segment_memory(BlockPool& pool, StreamObj& stream, std::size_t size);
  void check_allocator_unused() const;  // under mutex_
  // CUDA's capture rule for a call that gets new device memory for `stream` (throws).
  void check_new_memory(std::size_t size, StreamObj& stream);
  std::size_t device_total();  // the device's memory, asked of the driver once
  Block* try_allocate(BlockPool& pool, StreamObj& stream, std::size_t rounded, bool uncached);
  void split_block(Block* block, std::size_t size);
  // `freed_by`: the free's context (history level All), else the allocation's is recorded.
  void free_block(Block* block, const std::shared_ptr<HistoryContext>& freed_by = nullptr);
  void insert_events(Block* block);
  void process_events();
  bool release_cached_segments();
  // Releases the free segments of the pools `releasable(const BlockPool&)` accepts, then
  // forgets the private pools nobody holds that hold no memory. True if one was released.
  template <class Releasable>
  bool release_free_segments(Releasable releasable);
  void release_segment(Block* head);
  // Whether the segment may go back to the driver: wholly free, no event pending, not kept.
  bool segment_releasable(const Block* head) const;
  bool kept(const Block* head) const;  // a graph keeps the segment (keep_segment)
  BlockPool& pool_for(PoolId id, bool small);
  void maybe_drop_private_pool(BlockPool* pool);
  Block* segment_of(const void* ptr);
  void record_trace(TraceEntry::Action action, uint64_t addr, uint64_t size, const StreamObj* s,
                    PoolId pool, std::shared_ptr<HistoryContext> ctx);
  [[noreturn]] void throw_oom(std::size_t size, std::size_t alloc_size);

  // Statistics helpers: every change of a block's state goes through these.
  void add_active(Block* b, int sign);
  void add_inactive_split(Block* b, int sign);

  Runtime& rt_;
  const int device_;
  std::mutex mutex_;
  std::unique_ptr<BlockPool> small_;
  std::unique_ptr<BlockPool> large_;
  struct PrivatePool;
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools_;
  std::map<uintptr_t, Block*> segments_;     // segment heads by address
  std::unordered_map<uintptr_t, int> kept_;  // segments graphs keep (by base), and how often
  class PtrMap;
  std::unique_ptr<PtrMap> allocated_;  // allocated blocks by start address
  class BlockArena;
  std::unique_ptr<BlockArena> arena_;
  struct PendingEvent {
    DriverEvent event;
    int device;  // whose event pool it returns to
    Block* block;
  };
  std::vector<PendingEvent> pending_events_;
  std::vector<Block*> deferred_frees_;  // freed during a capture, events not recorded yet
  // Segments of user allocators (SegmentAllocator) released while their stream still had work:
  // given to the allocator's free once the event recorded then completed (process_events).
  struct PendingUserFree {
    DriverEvent event;
    void* ptr;
    std::size_t size;
    StreamObj* stream;
    SegmentAllocator allocator;
  };
  std::vector<PendingUserFree> pending_user_frees_;
  void user_free(const PendingUserFree& f);
  // Threads whose allocations go to a pool (begin_allocate_to_pool), innermost last.
  std::vector<std::pair<PoolId, std::thread::id>> thread_pools_;
  DeviceStats stats_;

  bool history_enabled_ = false;
  std::size_t reserve_limit_ = 0;
  bool caching_ = true;
  SegmentAllocator allocator_;  // set_allocator: the default pools' and new pools' source
  AllocatorSettings settings_;
  uint64_t free_seq_ = 0;         // stamps freed blocks (garbage collection frees the oldest)
  std::size_t device_total_ = 0;  // device_total()
  ContextRecorder recorder_;
  ContextLevel context_level_ = ContextLevel::All;
  std::size_t history_max_ = 0;
  std::deque<TraceEntry> history_;
};

// Pinned host memory: power-of-two size classes, reused after recorded streams pass the free.
class HostCachingAllocator {
 public:
  explicit HostCachingAllocator(Runtime& rt) : rt_(rt) {}
  ~HostCachingAllocator();
  void* malloc(std::size_t size);
  void free(void* ptr);
  void record_stream(void* ptr, Stream stream);
  // Is [ptr, ptr + size) inside one pinned block?
  bool contains(const void* ptr, std::size_t size);
  void empty_cache();
  // Graphs keep the pinned blocks their captured copies use (CachingAllocator::keep_segment):
  // the base of the block holding `ptr`, now kept once more (0 if none), and each kept once less.
  uintptr_t keep_block(const void* ptr);
  void unkeep_blocks(const std::vector<uintptr_t>& bases);
  HostStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();

 private:
  struct HBlock {
    void* ptr = nullptr;
    std::size_t size = 0;
    bool allocated = false;
    int events = 0;
    int kept = 0;  // graphs that keep it: not given back to the driver
    std::vector<Stream> uses;
  };
  HBlock* find_containing(const void* ptr);
  void process_events();
  void to_free_list(HBlock* b);
  void release_free_blocks();  // gives every cached block back to the driver

  Runtime& rt_;
  std::mutex mutex_;
  std::map<uintptr_t, std::unique_ptr<HBlock>> blocks_;
  std::array<std::vector<HBlock*>, 64> free_;
  std::deque<std::tuple<DriverEvent, int, HBlock*>> pending_;
  HostStats stats_;
};

}  // namespace accel::rt::detail
