// Device memory of the host driver, and the ACCEL_PROTECT_DEVICE_MEMORY debug mode.
//
// Device memory is mapped with mmap. When protection is on, it is mapped PROT_NONE and made
// readable and writable only while the runtime accesses it (a copy, a task on a stream, a
// HostAccessGuard). Access is reference counted per mapping, plus a device-wide count for tasks
// whose footprint is unknown, so nested and concurrent accesses are safe: a mapping becomes
// inaccessible again when the last accessor leaves. A host dereference of a device pointer
// outside runtime control then faults at once instead of silently working, as it would on a
// real GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace accel::rt::host {

class DeviceMemory {
 public:
  explicit DeviceMemory(bool protect) : protect_(protect) {}
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  bool protecting() const noexcept { return protect_; }

  // Maps `size` bytes (a multiple of the page size). nullptr if the kernel refuses.
  void* map(std::size_t size);
  void unmap(void* ptr, std::size_t size);

  // Virtual memory (expandable segments): a reservation of addresses with no memory behind
  // them; memory committed behind parts of it (pages made accessible, or tracked for protection,
  // merged with a committed range that ends where it starts) and decommitted from the end of a
  // committed range (its pages given back); the reservation released once nothing is committed.
  void* reserve(std::size_t size);
  void commit(void* ptr, std::size_t size);
  void decommit(void* ptr, std::size_t size);
  void release_reservation(void* ptr, std::size_t size);

  // Access to [ptr, ptr + size): parts outside device mappings are ignored.
  void acquire(const void* ptr, std::size_t size);
  void release(const void* ptr, std::size_t size);
  // Access to every mapping of the device.
  void acquire_all();
  void release_all();

  // True if ptr lies in one of this device's mappings (only tracked when protecting).
  bool owns(const void* ptr);

 private:
  struct Region {
    std::size_t size = 0;
    int count = 0;
  };
  template <class F>
  void for_each_overlap(const void* ptr, std::size_t size, F&& f);
  void set_access(uintptr_t base, std::size_t size, bool accessible);

  const bool protect_;
  std::mutex mutex_;
  std::map<uintptr_t, Region> regions_;  // only tracked when protecting
  int all_count_ = 0;
};

}  // namespace accel::rt::host
