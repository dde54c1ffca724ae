// The caching allocator's blocks, size bins and pools (private to the allocator's files).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <memory>
#include <vector>

#include "runtime/caching_allocator.h"

namespace accel::rt::detail {

// --- blocks and bins ----------------------------------------------------------------------

struct Expandable;

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
  bool uncached = false;  // allocated with caching off: its segment goes back when freed
  int event_count = 0;
  uint64_t freed_at = 0;             // when it last became free (CachingAllocator::free_seq_)
  std::size_t segment_size = 0;      // set on segment heads
  Expandable* expandable = nullptr;  // set on the head of an expandable segment
  std::vector<Stream> stream_uses;
  std::shared_ptr<HistoryContext> context;

  bool is_split() const { return prev != nullptr || next != nullptr; }
  uintptr_t addr() const { return reinterpret_cast<uintptr_t>(ptr); }
};

inline constexpr int kSLBits = 4;
inline constexpr uint32_t kSL = 1u << kSLBits;
inline constexpr uint32_t kFL = 48;
inline constexpr std::size_t kUnit = CachingAllocator::kMinBlockSize;
// Blocks of the request's own size class that are examined before moving up a class.
inline constexpr int kOwnBinProbe = 8;

inline void mapping(std::size_t units, uint32_t& fl, uint32_t& sl) {
  if (units < kSL) {
    fl = 0;
    sl = static_cast<uint32_t>(units);
  } else {
    const int msb = 63 - std::countl_zero(static_cast<uint64_t>(units));
    fl = static_cast<uint32_t>(msb - kSLBits + 1);
    sl = static_cast<uint32_t>((units >> (msb - kSLBits)) - kSL);
  }
}

inline std::size_t round_up(std::size_t n, std::size_t unit) {
  return (n + unit - 1) / unit * unit;
}

inline std::size_t round_size(std::size_t size) {
  return size < kUnit ? kUnit : round_up(size, kUnit);
}

inline std::size_t segment_size_for(std::size_t rounded) {
  if (rounded <= CachingAllocator::kSmallSize) return CachingAllocator::kSmallBuffer;
  if (rounded < CachingAllocator::kMinLargeAlloc) return CachingAllocator::kLargeBuffer;
  return round_up(rounded, CachingAllocator::kRoundLarge);
}

inline int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void update_stat(Stat& s, int64_t delta) {
  s.current += delta;
  if (s.current > s.peak) s.peak = s.current;
  if (delta > 0) s.allocated += delta;
  if (delta < 0) s.freed -= delta;
}

inline void update_stat(StatArray& a, bool small, int64_t delta) {
  update_stat(a[kAggregate], delta);
  update_stat(a[small ? kSmallPool : kLargePool], delta);
}

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

  // A free block of at least `size` and at most `largest` bytes, or nullptr (the smallest
  // class that has blocks decides: a larger class's first block is not looked past).
  Block* find(std::size_t size, std::size_t largest = SIZE_MAX) {
    uint32_t fl, sl;
    mapping(size / kUnit, fl, sl);
    int probe = 0;
    for (Block* b = heads[fl * kSL + sl]; b != nullptr && probe < kOwnBinProbe;
         b = b->bin_next, ++probe) {
      if (b->size >= size && b->size <= largest) return b;
    }
    // Every block of a higher class is large enough.
    Block* b = nullptr;
    const uint32_t sl_bits = sl + 1 < kSL ? sl_map[fl] & (~0u << (sl + 1)) : 0;
    const uint64_t fl_bits = fl + 1 < kFL ? fl_map & (~uint64_t{0} << (fl + 1)) : 0;
    if (sl_bits != 0) {
      b = heads[fl * kSL + std::countr_zero(sl_bits)];
    } else if (fl_bits != 0) {
      const uint32_t fl2 = static_cast<uint32_t>(std::countr_zero(fl_bits));
      b = heads[fl2 * kSL + std::countr_zero(sl_map[fl2])];
    }
    return b != nullptr && b->size <= largest ? b : nullptr;
  }
};

// A stream's expandable segment in a pool (AllocatorSettings::expandable_segments): addresses
// reserved once, device memory mapped behind [base, base + mapped) as allocations need it and
// unmapped from the end when the cache is emptied. Its blocks form one segment whose head (at
// base) has segment_size == mapped; nothing is mapped while head is null.
struct Expandable {
  char* base = nullptr;
  std::size_t reserved = 0;
  std::size_t granularity = 0;
  std::size_t mapped = 0;
  Block* head = nullptr;
  bool unavailable = false;  // the reservation was refused: classic segments instead
};

struct BlockPool {
  bool small = true;
  bool no_split = false;       // MemPoolOptions::no_split
  SegmentAllocator allocator;  // where its segments come from (the driver when is_driver())
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
  std::vector<std::unique_ptr<Expandable>> expandables;  // by stream slot
  Expandable& expandable(uint32_t slot) {
    if (slot >= expandables.size()) expandables.resize(slot + 1);
    auto& e = expandables[slot];
    if (!e) e = std::make_unique<Expandable>();
    return *e;
  }
};

struct CachingAllocator::PrivatePool {
  int use_count = 0;
  bool use_on_oom = false;
  BlockPool small;
  BlockPool large;
};

}  // namespace accel::rt::detail
