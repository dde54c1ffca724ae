// The host driver's device memory file and interprocess memory.
//
// Each device's memory is one memfd ("accel-host-device-N"): map() maps a range of it (first fit
// over the ranges given back, else the file grows; it is sparse, so its length costs nothing)
// and unmap() punches the range out of the file, which gives the pages back to the system. A
// handle names the file by the process holding it and its descriptor there (opened through
// /proc/<pid>/fd/<fd>, checked against the file's inode) and the range inside it: another
// process maps the same pages, as CUDA IPC maps the same GPU memory. The file and its pages live
// as long as some process maps them, so an opened mapping stays valid after its owner exits.
// Each virtual-memory reservation (an expandable segment) is a memory file of its own, mapped
// whole without access; committed pages become accessible and are allocated in the file when
// touched, decommitted ones are punched out, so that committed memory can be shared alike.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <string>

#include "runtime/drivers/host/protect.h"
#include "runtime/error.h"
#include "runtime/shared_file.h"

namespace accel::rt::host {
namespace {

constexpr char kMagic[8] = {'a', 'c', 'c', 'e', 'l', 'h', 'm', '1'};

struct HandleData {
  char magic[8];
  int32_t device;
  int32_t fd;
  int64_t pid;
  uint64_t inode;
  uint64_t offset;
  uint64_t size;
};
static_assert(sizeof(HandleData) <= sizeof(IpcMemHandle::bytes));

}  // namespace

void DeviceMemory::close_files() {
  if (fd_ >= 0) ::close(fd_);
  for (const auto& [base, r] : reservations_) ::close(r.fd);
}

void* DeviceMemory::reserve_pages(std::size_t size) {
  const std::string name = "accel-host-va-" + std::to_string(device_);
  uint64_t inode = 0;
  const int fd = detail::create_memory_file(name.c_str(), size, &inode);
  void* p =
      fd >= 0 ? ::mmap(nullptr, size, PROT_NONE, MAP_SHARED | MAP_NORESERVE, fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) {  // no memory file: private memory, which cannot be shared
    if (fd >= 0) ::close(fd);
    p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  reservations_[reinterpret_cast<uintptr_t>(p)] = {fd, inode, size};
  return p;
}

void DeviceMemory::drop_pages(void* ptr, std::size_t size) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = reservations_.upper_bound(p);
  if (it != reservations_.begin() && p < std::prev(it)->first + std::prev(it)->second.size) {
    --it;
    ::fallocate(it->second.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(p - it->first), static_cast<off_t>(size));
    return;
  }
  ::madvise(ptr, size, MADV_DONTNEED);
}

void DeviceMemory::forget_reservation(void* ptr) {
  auto it = reservations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == reservations_.end()) return;
  ::close(it->second.fd);
  reservations_.erase(it);
}

int64_t DeviceMemory::take_file_range(std::size_t size) {
  if (fd_ < 0) {
    if (fd_refused_) return -1;
    const std::string name = "accel-host-device-" + std::to_string(device_);
    fd_ = detail::create_memory_file(name.c_str(), 0, &inode_);
    if (fd_ < 0) {
      fd_refused_ = true;
      return -1;
    }
  }
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - size;
    free_ranges_.erase(it);
    if (rest > 0) free_ranges_[offset + size] = rest;
    return static_cast<int64_t>(offset);
  }
  const uint64_t offset = file_size_;
  if (::ftruncate(fd_, static_cast<off_t>(offset + size)) != 0) return -1;
  file_size_ = offset + size;
  return static_cast<int64_t>(offset);
}

void DeviceMemory::give_file_range(uint64_t offset, std::size_t size) {
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(size));
  uint64_t lo = offset;
  uint64_t len = size;
  auto next = free_ranges_.lower_bound(lo);
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == lo) {
      lo = prev->first;
      len += prev->second;
      free_ranges_.erase(prev);
    }
  }
  if (next != free_ranges_.end() && next->first == offset + size) {
    len += next->second;
    free_ranges_.erase(next);
  }
  free_ranges_[lo] = len;
}

void* DeviceMemory::map_pages(std::size_t size, int prot) {
  const int64_t offset = take_file_range(size);
  if (offset < 0) {  // no memory file: private memory, which cannot be shared
    void* p = ::mmap(nullptr, size, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void* p = ::mmap(nullptr, size, prot, MAP_SHARED | MAP_NORESERVE, fd_, offset);
  if (p == MAP_FAILED) {
    give_file_range(static_cast<uint64_t>(offset), size);
    return nullptr;
  }
  file_maps_[reinterpret_cast<uintptr_t>(p)] = {static_cast<uint64_t>(offset), size};
  return p;
}

IpcMemHandle DeviceMemory::ipc_handle(const void* base, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = reinterpret_cast<uintptr_t>(base);
  HandleData h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.device = device_;
  h.pid = ::getpid();
  if (auto it = file_maps_.find(p); it != file_maps_.end()) {
    h.fd = fd_;
    h.inode = inode_;
    h.offset = it->second.first;
    h.size = it->second.second;
  } else {
    auto r = reservations_.upper_bound(p);
    const bool inside =
        r != reservations_.begin() && p + size <= std::prev(r)->first + std::prev(r)->second.size;
    ACCEL_RT_CHECK(inside, NotSupportedError, "host driver: ", format_ptr(base), " (", size,
                   " bytes) is not device memory of device ", device_,
                   " that can be shared with another process (memory raw_alloc returned, or "
                   "committed in a reservation, can)");
    --r;
    h.fd = r->second.fd;
    h.inode = r->second.inode;
    h.offset = p - r->first;
    h.size = size;
  }
  IpcMemHandle out;
  std::memcpy(out.bytes, &h, sizeof(h));
  return out;
}

void* DeviceMemory::open_shared(const IpcMemHandle& handle, std::size_t* size) {
  HandleData h{};
  std::memcpy(&h, handle.bytes, sizeof(h));
  ACCEL_RT_CHECK(std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0, InvalidValueError,
                 "host driver: the handle is not a host driver's memory handle");
  ACCEL_RT_CHECK(h.device == device_, InvalidValueError,
                 "host driver: the handle names memory of "
                 "device ",
                 h.device, ", not of device ", device_);
  std::string why;
  const int fd = detail::open_peer_file(h.pid, h.fd, h.inode, h.offset + h.size, &why);
  ACCEL_RT_CHECK(fd >= 0, InvalidValueError, "host driver: the device memory of process ", h.pid,
                 ": ", why);
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = ::mmap(nullptr, h.size, mapping_prot(), MAP_SHARED | MAP_NORESERVE, fd,
                   static_cast<off_t>(h.offset));
  const int map_errno = errno;
  ::close(fd);
  ACCEL_RT_CHECK(p != MAP_FAILED, OutOfMemoryError, "host driver: cannot map ", h.size,
                 " bytes of shared device memory: ", std::strerror(map_errno));
  opened_[reinterpret_cast<uintptr_t>(p)] = h.size;
  track(reinterpret_cast<uintptr_t>(p), h.size);
  *size = h.size;
  return p;
}

void DeviceMemory::close_shared(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto base = reinterpret_cast<uintptr_t>(ptr);
  auto it = opened_.find(base);
  ACCEL_RT_CHECK(it != opened_.end(), InvalidValueError, "host driver: ", format_ptr(ptr),
                 " is not device memory opened from another process's handle");
  if (protect_) regions_.erase(base);
  ::munmap(ptr, it->second);
  opened_.erase(it);
}

bool DeviceMemory::in_opened(const void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = opened_.upper_bound(p);
  if (it == opened_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace accel::rt::host
