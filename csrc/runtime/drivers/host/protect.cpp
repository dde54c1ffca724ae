#include "runtime/drivers/host/protect.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace accel::rt::host {

void* DeviceMemory::map(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int prot = (protect_ && all_count_ == 0) ? PROT_NONE : (PROT_READ | PROT_WRITE);
  void* p = ::mmap(nullptr, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (protect_) regions_[reinterpret_cast<uintptr_t>(p)] = Region{size, 0};
  return p;
}

void DeviceMemory::unmap(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (protect_) regions_.erase(reinterpret_cast<uintptr_t>(ptr));
  ::munmap(ptr, size);
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
