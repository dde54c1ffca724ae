// Memory files shared between processes (memfd): made here, or opened from another process
// through /proc/<pid>/fd/<fd> (the host driver's device memory, the runtime's IPC reference
// counters). Linux only, as the runtime is.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace accel::rt::detail {

// A memory file of `size` bytes (close-on-exec) and its inode: the descriptor, or -1 with errno
// set.
inline int create_memory_file(const char* name, uint64_t size, uint64_t* inode) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || ::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  *inode = static_cast<uint64_t>(st.st_ino);
  return fd;
}

// A shared read-write mapping of the first `size` bytes of memory file `fd`, or nullptr with
// errno set.
inline void* map_memory_file(int fd, std::size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A memory file of `size` bytes mapped here (*mapping) and its inode: the descriptor, or -1 with
// errno set and nothing left open or mapped.
inline int create_mapped_memory_file(const char* name, uint64_t size, uint64_t* inode,
                                     void** mapping) {
  const int fd = create_memory_file(name, size, inode);
  if (fd < 0) return -1;
  *mapping = map_memory_file(fd, size);
  if (*mapping == nullptr) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

// Process `pid`'s descriptor `fd`, opened here if it is still the file with `inode` and holds at
// least `min_size` bytes: the descriptor, or -1 with `why` saying what went wrong.
inline int open_peer_file(int64_t pid, int fd, uint64_t inode, uint64_t min_size,
                          std::string* why) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%lld/fd/%d", static_cast<long long>(pid), fd);
  const int mine = ::open(path, O_RDWR | O_CLOEXEC);
  if (mine < 0) {
    *why = std::string("cannot open ") + path + ": " + std::strerror(errno) +
           " (the process that shared it has exited, or this one may not read its files)";
    return -1;
  }
  struct stat st {};
  if (::fstat(mine, &st) != 0 || static_cast<uint64_t>(st.st_ino) != inode ||
      static_cast<uint64_t>(st.st_size) < min_size) {
    ::close(mine);
    *why = "process " + std::to_string(pid) + " no longer holds it";
    return -1;
  }
  return mine;
}

}  // namespace accel::rt::detail
