#include "runtime/drivers/host/protect.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace accel::rt::host {

void* DeviceMemory::map(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = map_pages(size, mapping_prot());
  if (p != nullptr) track(reinterpret_cast<uintptr_t>(p), size);
  return p;
}

int DeviceMemory::mapping_prot() const {
  return (protect_ && all_count_ == 0) ? PROT_NONE : (PROT_READ | PROT_WRITE);
}

void DeviceMemory::track(uintptr_t base, std::size_t size) {
  if (protect_) regions_[base] = Region{size, 0};
}

void DeviceMemory::unmap(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  if (protect_) regions_.erase(base);
  ::munmap(ptr, size);
  if (auto it = file_maps_.find(base); it != file_maps_.end()) {
    give_file_range(it->second.first, it->second.second);
    file_maps_.erase(it);
  }
}

void* DeviceMemory::reserve(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserve_pages(size);
}

void DeviceMemory::commit(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  bool accessible = !protect_ || all_count_ > 0;
  if (protect_) {
    auto it = regions_.lower_bound(base);
    if (it != regions_.begin() && std::prev(it)->first + std::prev(it)->second.size == base) {
      Region& r = std::prev(it)->second;  // grows the range that ends here
      r.size += size;
      accessible = accessible || r.count > 0;
    } else {
      regions_[base] = Region{size, 0};
    }
  }
  set_access(base, size, accessible);
}

void DeviceMemory::decommit(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto lo = reinterpret_cast<uintptr_t>(ptr);
  if (protect_) {
    // The tail of a committed range (or all of it): cut it off.
    auto it = regions_.upper_bound(lo);
    if (it != regions_.begin()) {
      auto r = std::prev(it);
      if (r->first + r->second.size > lo) {
        if (r->first == lo) {
          regions_.erase(r);
        } else {
          r->second.size = lo - r->first;
        }
      }
    }
  }
  drop_pages(ptr, size);  // the pages go back to the system
  ::mprotect(ptr, size, PROT_NONE);
}

void DeviceMemory::release_reservation(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (protect_) {
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    regions_.erase(regions_.lower_bound(lo), regions_.lower_bound(lo + size));
  }
  ::munmap(ptr, size);
  forget_reservation(ptr);
}

void DeviceMemory::set_access(uintptr_t base, std::size_t size, bool accessible) {
  const int prot = accessible ? (PROT_READ | PROT_WRITE) : PROT_NONE;
  if (::mprotect(reinterpret_cast<void*>(base), size, prot) != 0) {
    ACCEL_RT_THROW(DriverError, "host driver: mprotect(", format_ptr(reinterpret_cast<void*>(base)),
                   ", ", size, ") failed: ", std::strerror(errno));
  }
}

template <class F>
void DeviceMemory::for_each_overlap(const void* ptr, std::size_t size, F&& f) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t hi = lo + (size == 0 ? 1 : size);
  auto it = regions_.upper_bound(lo);
  if (it != regions_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > lo) it = prev;
  }
  for (; it != regions_.end() && it->first < hi; ++it) f(it->first, it->second);
}

void DeviceMemory::acquire(const void* ptr, std::size_t size) {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_overlap(ptr, size, [&](uintptr_t base, Region& r) {
    if (r.count++ == 0 && all_count_ == 0) set_access(base, r.size, true);
  });
}

void DeviceMemory::release(const void* ptr, std::size_t size) {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_overlap(ptr, size, [&](uintptr_t base, Region& r) {
    if (r.count > 0 && --r.count == 0 && all_count_ == 0) set_access(base, r.size, false);
  });
}

void DeviceMemory::acquire_all() {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (all_count_++ == 0) {
    for (auto& [base, r] : regions_) {
      if (r.count == 0) set_access(base, r.size, true);
    }
  }
}

void DeviceMemory::release_all() {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (all_count_ > 0 && --all_count_ == 0) {
    for (auto& [base, r] : regions_) {
      if (r.count == 0) set_access(base, r.size, false);
    }
  }
}

bool DeviceMemory::owns(const void* ptr) {
  if (!protect_) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  bool found = false;
  for_each_overlap(ptr, 1, [&](uintptr_t, Region&) { found = true; });
  return found;
}

}  // namespace accel::rt::host
