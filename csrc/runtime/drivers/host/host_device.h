// One device of the host driver: its memory (with the frees that wait for its streams), its
// streams, and how busy they are (private to the host driver).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/drivers/host/busy_clock.h"
#include "runtime/drivers/host/host_stream.h"
#include "runtime/drivers/host/protect.h"

namespace accel::rt::host {

// A point in the execution of every stream of a device.
struct Marker {
  std::vector<std::pair<std::shared_ptr<HostStream>, uint64_t>> positions;
  bool passed() const {
    for (const auto& [s, n] : positions) {
      if (s->completed.load(std::memory_order_acquire) < n) return false;
    }
    return true;
  }
};

struct HostDevice {
  uint64_t capacity = 0;
  std::atomic<uint64_t> used{0};  // mapped bytes, including frees not yet reclaimed
  DeviceMemory memory;
  BusyClock busy;  // when its streams ran tasks (utilization)
  std::mutex m;    // streams and deferred
  std::vector<std::shared_ptr<HostStream>> streams;
  struct Deferred {
    void* ptr;
    std::size_t size;
    Marker marker;
  };
  std::vector<Deferred> deferred;

  HostDevice(uint64_t cap, bool protect) : capacity(cap), memory(protect) {}

  Marker marker_locked() {
    Marker mk;
    for (auto& s : streams) {
      const uint64_t n = s->submitted.load(std::memory_order_acquire);
      if (s->completed.load(std::memory_order_acquire) < n) mk.positions.emplace_back(s, n);
    }
    return mk;
  }

  void reclaim() {
    std::vector<Deferred> ready;
    {
      std::lock_guard<std::mutex> lock(m);
      if (deferred.empty()) return;
      auto it = std::partition(deferred.begin(), deferred.end(),
                               [](const Deferred& d) { return !d.marker.passed(); });
      std::move(it, deferred.end(), std::back_inserter(ready));
      deferred.erase(it, deferred.end());
    }
    for (auto& d : ready) {
      memory.unmap(d.ptr, d.size);
      used.fetch_sub(d.size);
    }
  }
};

}  // namespace accel::rt::host
