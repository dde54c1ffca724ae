// The caching allocator's bookkeeping structures: its map of allocated blocks and its arena of
// Block objects (private to caching_allocator.cpp).
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/allocator_blocks.h"

namespace accel::rt::detail {

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

}  // namespace accel::rt::detail
