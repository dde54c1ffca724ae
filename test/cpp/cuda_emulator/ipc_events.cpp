// The emulated CUDA runtime: interprocess events (cudaEventInterprocess, cudaIpcGetEventHandle,
// cudaIpcOpenEventHandle). An interprocess event's record count and completed count live in a
// slot of its process's memory file, which other processes map from the handle; records,
// waits and queries in any process act on that slot. Waiting polls it (the emulator needs no
// futex: tests wait milliseconds). As CUDA, a handle of the calling process itself is refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "emulator.h"

namespace cuda_emulator {
namespace {

constexpr uint32_t kSlots = 4096;
constexpr std::size_t kFileBytes = kSlots * sizeof(IpcEventState);
constexpr char kMagic[8] = {'e', 'm', 'u', 'l', 'e', 'v', 't', '1'};

struct HandleData {
  char magic[8];
  int64_t pid;
  int32_t fd;
  uint32_t slot;
};

struct Files {  // under the global lock
  int fd = -1;
  std::shared_ptr<void> own;
  uint32_t next = 0;
  std::map<int64_t, std::weak_ptr<void>> peers;
};
Files& files() {
  static auto* f = new Files();
  return *f;
}

std::shared_ptr<void> map_file(int fd) {
  void* p = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  return std::shared_ptr<void>(p, [](void* q) { ::munmap(q, kFileBytes); });
}

uint64_t load(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

void wait_done(IpcEventState* st, uint64_t version) {
  while (load(&st->done) < version) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

}  // namespace

cudaError_t ipc_event_create(cudaEvent_t* event, unsigned flags) {
  // CUDA: interprocess events must not time.
  if ((flags & cudaEventDisableTiming) == 0) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(global_mutex());
  Files& f = files();
  if (!f.own) {
    const int fd = ::memfd_create("cuda-emulator-events", MFD_CLOEXEC);
    std::shared_ptr<void> own =
        fd >= 0 && ::ftruncate(fd, kFileBytes) == 0 ? map_file(fd) : nullptr;
    if (!own) {
      if (fd >= 0) ::close(fd);  // nothing kept from a failed attempt
      return cudaErrorMemoryAllocation;
    }
    f.fd = fd;
    f.own = std::move(own);
  }
  if (f.next == kSlots) return cudaErrorMemoryAllocation;  // slots are not reused here
  auto* e = new CUevent_st;
  e->flags = flags;
  e->ipc = static_cast<IpcEventState*>(f.own.get()) + f.next++;
  e->ipc_file = f.own;
  *event = e;
  return cudaSuccess;
}

cudaError_t ipc_event_record(CUevent_st* e, CUstream_st* s) {
  std::lock_guard<std::mutex> lock(global_mutex());
  if (s->capture != nullptr) {
    invalidate(s->capture);
    return cudaErrorStreamCaptureUnsupported;
  }
  IpcEventState* st = e->ipc;
  const uint64_t version = __atomic_add_fetch(&st->recorded, uint64_t{1}, __ATOMIC_ACQ_REL);
  enqueue(s, [st, version, file = e->ipc_file] {
    uint64_t seen = load(&st->done);
    while (seen < version && !__atomic_compare_exchange_n(&st->done, &seen, version, false,
                                                          __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
  });
  return cudaSuccess;
}

cudaError_t ipc_event_wait(CUstream_st* s, CUevent_st* e) {
  IpcEventState* st = e->ipc;
  const uint64_t version = load(&st->recorded);
  if (load(&st->done) >= version) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(global_mutex());
    if (s->capture != nullptr) {  // eager work cannot order captured work
      invalidate(s->capture);
      return cudaErrorStreamCaptureIsolation;
    }
  }
  return submit(
      s, [st, version, file = e->ipc_file] { wait_done(st, version); }, "wait event");
}

cudaError_t ipc_event_query_or_wait(CUevent_st* e, bool block) {
  if (const cudaError_t err = unsafe_call(); err != cudaSuccess) return err;
  const uint64_t version = load(&e->ipc->recorded);
  if (!block) return load(&e->ipc->done) >= version ? cudaSuccess : cudaErrorNotReady;
  wait_done(e->ipc, version);
  return cudaSuccess;
}

}  // namespace cuda_emulator

using namespace cuda_emulator;

extern "C" {

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t event) {
  EMU_ENTER();
  if (handle == nullptr) return fail(cudaErrorInvalidValue);
  if (event == nullptr || event->ipc == nullptr) return fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> lock(global_mutex());
  HandleData h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.pid = ::getpid();
  h.fd = files().fd;
  h.slot = static_cast<uint32_t>(event->ipc - static_cast<IpcEventState*>(files().own.get()));
  static_assert(sizeof(h) <= sizeof(*handle));
  std::memset(handle, 0, sizeof(*handle));
  std::memcpy(handle, &h, sizeof(h));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* event, cudaIpcEventHandle_t handle) {
  EMU_ENTER();
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  HandleData h{};
  std::memcpy(&h, &handle, sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.slot >= kSlots) {
    return fail(cudaErrorInvalidValue);
  }
  if (h.pid == ::getpid()) return fail(cudaErrorInvalidValue);  // HIP: InvalidContext
  std::lock_guard<std::mutex> lock(global_mutex());
  std::shared_ptr<void> file = files().peers[h.pid].lock();
  if (!file) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%lld/fd/%d", static_cast<long long>(h.pid), h.fd);
    const int fd = ::open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return fail(cudaErrorInvalidResourceHandle);
    file = map_file(fd);
    ::close(fd);
    if (!file) return fail(cudaErrorMapBufferObjectFailed);
    files().peers[h.pid] = file;
  }
  auto* e = new CUevent_st;
  e->flags = cudaEventInterprocess | cudaEventDisableTiming;
  e->ipc = static_cast<IpcEventState*>(file.get()) + h.slot;
  e->ipc_file = std::move(file);
  *event = e;
  return cudaSuccess;
}

}  // extern "C"
