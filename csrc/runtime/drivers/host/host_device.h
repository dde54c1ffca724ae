// One device of the host driver: its memory (with the frees that wait for its streams), its
// streams, and how busy they are (private to the host driver).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/drivers/host/busy_clock.h"
#include "runtime/drivers/host/host_stream.h"
#include "runtime/drivers/host/protect.h"

namespace accel::rt::host {

// The UUID of host device `device` of the driver named `driver`: the same on this machine in
// every process (from /etc/machine-id, else the host name), different per device and machine
// (RFC 9562 version 8: its bits are a hash, not a registered scheme). host_options.cpp.
std::array<uint8_t, 16> host_device_uuid(std::string_view driver, int device);

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
  // Memory given back once every stream passed the point where it was given back.
  struct Deferred {
    // raw_free, va_unmap, va_release, ipc_close_mem_handle
    enum class Kind { Unmap, Decommit, Release, Close };
    void* ptr;
    std::size_t size;
    Kind kind;
    Marker marker;
  };
  std::vector<Deferred> deferred;

  HostDevice(uint64_t cap, bool protect, int index) : capacity(cap), memory(protect, index) {}

  // Counts `bytes` against the capacity; false (nothing counted) when they do not fit.
  bool take(uint64_t bytes) {
    uint64_t u = used.load();
    do {
      if (bytes > capacity || u > capacity - bytes) return false;
    } while (!used.compare_exchange_weak(u, u + bytes));
    return true;
  }

  Marker marker_locked() {
    Marker mk;
    for (auto& s : streams) {
      const uint64_t n = s->submitted.load(std::memory_order_acquire);
      if (s->completed.load(std::memory_order_acquire) < n) mk.positions.emplace_back(s, n);
    }
    return mk;
  }

  // Gives [ptr, ptr + size) back now if no stream has work queued, else once they passed it.
  void give_back(void* ptr, std::size_t size, Deferred::Kind kind) {
    {
      std::lock_guard<std::mutex> lock(m);
      Marker mk = marker_locked();
      if (!mk.positions.empty()) {
        deferred.push_back(Deferred{ptr, size, kind, std::move(mk)});
        return;
      }
    }
    run(Deferred{ptr, size, kind, {}});
  }

  void reclaim() {
    std::vector<Deferred> ready;
    {
      std::lock_guard<std::mutex> lock(m);
      if (deferred.empty()) return;
      // In order: a reservation is released after the decommits inside it.
      auto it = std::stable_partition(deferred.begin(), deferred.end(),
                                      [](const Deferred& d) { return !d.marker.passed(); });
      std::move(it, deferred.end(), std::back_inserter(ready));
      deferred.erase(it, deferred.end());
    }
    for (auto& d : ready) run(d);
  }

  // Waits until no decommit of [ptr, ptr + size) is pending (memory mapped there again must not
  // be decommitted by an earlier va_unmap).
  void settle(const void* ptr, std::size_t size) {
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t hi = lo + size;
    for (;;) {
      reclaim();
      bool pending = false;
      {
        std::lock_guard<std::mutex> lock(m);
        for (const Deferred& d : deferred) {
          const auto b = reinterpret_cast<uintptr_t>(d.ptr);
          pending = pending || (d.kind == Deferred::Kind::Decommit && b < hi && lo < b + d.size);
        }
      }
      if (!pending) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

 private:
  void run(const Deferred& d) {
    switch (d.kind) {
      case Deferred::Kind::Unmap:
        memory.unmap(d.ptr, d.size);
        used.fetch_sub(d.size);
        break;
      case Deferred::Kind::Decommit:
        memory.decommit(d.ptr, d.size);
        used.fetch_sub(d.size);
        break;
      case Deferred::Kind::Release: memory.release_reservation(d.ptr, d.size); break;
      case Deferred::Kind::Close: memory.close_shared(d.ptr); break;
    }
  }
};

}  // namespace accel::rt::host
