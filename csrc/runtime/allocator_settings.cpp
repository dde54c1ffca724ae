// PyTorch's allocator settings in the device caching allocator (AllocatorSettings, with the
// meaning c10's CUDA allocator gives them): sizes rounded to power-of-two divisions, oversize
// blocks that are never split, and garbage collection of cached segments over a threshold.
#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "runtime/allocator_blocks.h"
#include "runtime/caching_allocator.h"

namespace accel::rt::detail {
namespace {

constexpr int kFirstIntervalLog2 = 20;  // divisions are given per [2^(20+i), 2^(21+i))

// `size` rounded up to the next of `divisions` equal steps between the powers of two around it.
std::size_t round_to_division(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  const std::size_t step = floor / std::bit_floor(divisions);
  return step == 0 ? floor * 2 : (size + step - 1) / step * step;
}

}  // namespace

void CachingAllocator::set_settings(const AllocatorSettings& settings) {
  std::lock_guard<std::mutex> lock(mutex_);
  settings_ = settings;
  stats_.max_split_size = settings.max_split_size == std::numeric_limits<std::size_t>::max()
                              ? -1
                              : static_cast<int64_t>(settings.max_split_size);
  recount_oversize();
}

AllocatorSettings CachingAllocator::settings() {
  std::lock_guard<std::mutex> lock(mutex_);
  return settings_;
}

std::size_t CachingAllocator::round_request(std::size_t size) const {
  const std::vector<std::size_t>& table = settings_.roundup_power2_divisions;
  if (!table.empty() && size > kMinBlockSize) {
    const int log2 = std::bit_width(size) - 1;
    const std::size_t index = std::min<std::size_t>(
        static_cast<std::size_t>(std::max(log2 - kFirstIntervalLog2, 0)), table.size() - 1);
    const std::size_t divisions = table[index];
    if (divisions > 1 && size > kMinBlockSize * divisions) {
      return round_to_division(size, divisions);
    }
  }
  return round_size(size);
}

std::size_t CachingAllocator::largest_fit(const BlockPool& pool, std::size_t rounded) const {
  if (pool.small) return std::numeric_limits<std::size_t>::max();
  if (!oversize(rounded)) return settings_.max_split_size - 1;  // oversize blocks stay whole
  // A block max_non_split_rounding or more larger than the request is left for another.
  const std::size_t slack = std::max<std::size_t>(settings_.max_non_split_rounding, 1);
  return rounded > std::numeric_limits<std::size_t>::max() - slack
             ? std::numeric_limits<std::size_t>::max()
             : rounded + slack - 1;
}

bool CachingAllocator::splits(const BlockPool& pool, std::size_t rounded, std::size_t rest) const {
  // Expandable segments keep any remainder: a free end is unmapped or grown, never stranded.
  if (pool.small || (settings_.expandable_segments && !pool.is_private)) {
    return rest >= kMinBlockSize;
  }
  return !oversize(rounded) && rest > kSmallSize;
}

void CachingAllocator::garbage_collect(const BlockPool& pool, std::size_t incoming) {
  const double threshold = settings_.garbage_collection_threshold;
  // No memory is freed while a capture is underway (CUDA forbids it).
  if (threshold <= 0.0 || pool.is_private || rt_.capturing_anywhere()) return;
  const std::size_t allowed = reserve_limit_ != 0 ? reserve_limit_ : device_total();
  const auto target = static_cast<std::size_t>(threshold * static_cast<double>(allowed));
  auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAggregate].current);
  if (reserved + incoming <= target) return;
  std::vector<Block*> idle;  // whole free segments of the default pools
  for (const auto& [addr, head] : segments_) {
    if (!head->pool->is_private && head->expandable == nullptr && segment_releasable(head)) {
      idle.push_back(head);
    }
  }
  std::sort(idle.begin(), idle.end(),
            [](const Block* a, const Block* b) { return a->freed_at < b->freed_at; });
  for (Block* head : idle) {
    if (reserved + incoming <= target) break;
    reserved -= head->segment_size;
    release_segment(head);
  }
}

void CachingAllocator::recount_oversize() {
  int64_t segments = 0;
  int64_t allocations = 0;
  for (const auto& [addr, head] : segments_) {
    if (head->expandable == nullptr && oversize(head->segment_size)) ++segments;
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (b->allocated && oversize(b->size)) ++allocations;
    }
  }
  for (auto [stat, count] : {std::pair{&stats_.oversize_segments, segments},
                             std::pair{&stats_.oversize_allocations, allocations}}) {
    stat->current = count;
    stat->peak = std::max(stat->peak, count);
  }
}

}  // namespace accel::rt::detail
