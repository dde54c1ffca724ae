// Device memory of the host driver, and the ACCEL_PROTECT_DEVICE_MEMORY debug mode.
//
// Device memory is mapped with mmap from the device's memory file (a memfd; shared_memory.cpp),
// so that another process can map the same pages (torch.multiprocessing of accel tensors, as
// CUDA IPC shares GPU memory); freed pages are punched out of the file. When protection is on, it
// is mapped PROT_NONE and made readable and writable only while the runtime accesses it (a copy, a
// task on a stream, a HostAccessGuard). Access is reference counted per mapping, plus a device-wide
// count for tasks whose footprint is unknown, so nested and concurrent accesses are safe: a mapping
// becomes inaccessible again when the last accessor leaves. A host dereference of a device pointer
// outside runtime control then faults at once instead of silently working, as it would on a
// real GPU.
//
// Tasks of unknown footprint open mappings lazily: while one runs, a mapping becomes accessible
// when something first touches it (a SIGSEGV that the driver's handler resolves by opening that
// mapping, after which the access is retried), and the mappings opened so are closed when the last
// such task ends. Only what the tasks touch is reprotected (all mappings, before: with 47 of them
// after a model, 25x slower per small operator). What is accessible while such a task runs is the
// same as before: any mapping, from any thread. Other faults go to the handler installed before
// (Python's faulthandler, a sanitizer's, the default action). The kernel does not fault for
// user memory (a syscall given an unopened mapping fails with EFAULT), so code that hands device
// memory to a syscall takes explicit access (HostAccessGuard), as the distributed backend does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "runtime/types.h"

namespace accel::rt::host {

class DeviceMemory {
 public:
  DeviceMemory(bool protect, int device);
  ~DeviceMemory();
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

  // The fault handler's part (protect.cpp): opens the mapping that holds `addr` if tasks of
  // unknown footprint run (true), else false (the fault is someone else's).
  bool open_on_fault(const void* addr) noexcept;

  // True if ptr lies in one of this device's mappings (only tracked when protecting).
  bool owns(const void* ptr);

  // Interprocess memory (shared_memory.cpp): the handle of [base, base + size), a mapping map()
  // made or memory committed in a reservation; another process's (or this one's) mapping opened
  // from its handle, and closed; whether ptr lies in such an opened mapping.
  IpcMemHandle ipc_handle(const void* base, std::size_t size);
  void* open_shared(const IpcMemHandle& handle, std::size_t* size);
  void close_shared(void* ptr);
  bool in_opened(const void* ptr);

 private:
  struct Region {
    std::size_t size = 0;
    int count = 0;
    bool lazy = false;  // opened by a touch while tasks of unknown footprint run
  };

  template <class F>
  void for_each_overlap(const void* ptr, std::size_t size, F&& f);
  void set_access(uintptr_t base, std::size_t size, bool accessible);

  // The memory file's pages for a new mapping of `size` bytes (its offset), and their return.
  // -1: no memory file here (memfd_create refused): map() falls back to private memory.
  int64_t take_file_range(std::size_t size);
  void give_file_range(uint64_t offset, std::size_t size);
  void* map_pages(std::size_t size, int prot);  // under mutex_
  // Reservations (under mutex_): addresses over a memory file of their own, where one exists;
  // committed pages given back (punched out of the file); the file closed with the reservation.
  void* reserve_pages(std::size_t size);
  void drop_pages(void* ptr, std::size_t size);
  void forget_reservation(void* ptr);
  void close_files();  // the memory files (shared_memory.cpp), at destruction
  void track(uintptr_t base, std::size_t size);  // a new mapping, for protection
  // A new mapping's protection: none while protecting and nothing accesses every mapping.
  int mapping_prot() const;  // under mutex_

  const bool protect_;
  const int device_;
  // The memory file: its descriptor (-1 before the first mapping or if refused), inode, length.
  int fd_ = -1;
  bool fd_refused_ = false;
  uint64_t inode_ = 0;
  uint64_t file_size_ = 0;
  std::map<uint64_t, uint64_t> free_ranges_;                         // offset -> length, coalesced
  std::map<uintptr_t, std::pair<uint64_t, std::size_t>> file_maps_;  // address -> (offset, size)
  std::map<uintptr_t, std::size_t> opened_;                          // open_shared's mappings
  struct ReservationFile {
    int fd;
    uint64_t inode;
    std::size_t size;
  };
  std::map<uintptr_t, ReservationFile> reservations_;  // by address
  std::mutex mutex_;
  std::map<uintptr_t, Region> regions_;  // only tracked when protecting
  int all_count_ = 0;
  uint64_t closes_ = 0;  // times all_count_ fell to 0 (open_on_fault's retry guard)
};

// Runtime access to [ptr, ptr + size) for the scope of a copy (nothing when `mem` is null: the
// driver does not protect its memory).
struct ScopedAccess {
  DeviceMemory* mem;
  const void* p;
  std::size_t n;
  ScopedAccess(DeviceMemory* m, const void* ptr, std::size_t size) : mem(m), p(ptr), n(size) {
    if (mem) mem->acquire(p, n);
  }
  ~ScopedAccess() {
    if (mem) mem->release(p, n);
  }
  ScopedAccess(const ScopedAccess&) = delete;
  ScopedAccess& operator=(const ScopedAccess&) = delete;
};

}  // namespace accel::rt::host
