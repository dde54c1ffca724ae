// The host driver's interprocess events (see ipc_events.h).
#include "runtime/drivers/host/ipc_events.h"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "runtime/drivers/host/host_stream.h"
#include "runtime/error.h"
#include "runtime/shared_file.h"

namespace accel::rt::host {
namespace {

constexpr uint32_t kSlots = 4096;  // interprocess events alive at once, per process (256 KiB)
constexpr std::size_t kFileBytes = std::size_t{kSlots} * sizeof(SharedEventState);
constexpr char kMagic[8] = {'a', 'c', 'c', 'e', 'l', 'h', 'e', '1'};

struct HandleData {
  char magic[8];
  int32_t device;
  int32_t fd;
  int64_t pid;
  uint64_t inode;
  uint64_t generation;
  uint32_t slot;
};
static_assert(sizeof(HandleData) <= sizeof(IpcEventHandle::bytes));

template <class T>
T load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

long futex(uint32_t* word, int op, uint32_t value, const struct timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word lies in a mapping other processes share.
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

// A mapping of an event file, unmapped with its last user.
std::shared_ptr<void> own_mapping(void* p) {
  if (p == nullptr) return nullptr;
  return std::shared_ptr<void>(p, [](void* q) { ::munmap(q, kFileBytes); });
}

struct Registry {
  std::mutex m;
  // This process's event file (made at the first interprocess event; kept until exit).
  int fd = -1;
  uint64_t inode = 0;
  std::shared_ptr<void> file;
  uint32_t cursor = 0;  // where the search for a free slot starts
  // Files of other processes, mapped while events opened from them live.
  std::map<std::pair<int64_t, uint64_t>, std::weak_ptr<void>> peers;
};

Registry& registry() {
  static Registry* r = new Registry();  // outlives stream workers at exit
  return *r;
}

SharedEventState* slots(const std::shared_ptr<void>& file) {
  return static_cast<SharedEventState*>(file.get());
}

}  // namespace

SharedEventSlot::~SharedEventSlot() {
  __atomic_fetch_sub(&state_->refs, 1u, __ATOMIC_ACQ_REL);
}

uint64_t SharedEventSlot::issue_record() {
  return __atomic_add_fetch(&state_->recorded, uint64_t{1}, __ATOMIC_ACQ_REL);
}

uint64_t SharedEventSlot::last_record() const {
  return load(&state_->recorded);
}

uint64_t SharedEventSlot::completed() const {
  return load(&state_->done);
}

void SharedEventSlot::complete(uint64_t version) {
  uint64_t seen = load(&state_->done);
  while (seen < version && !__atomic_compare_exchange_n(&state_->done, &seen, version, false,
                                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
  __atomic_add_fetch(&state_->wake, 1u, __ATOMIC_ACQ_REL);
  futex(&state_->wake, FUTEX_WAKE, INT_MAX, nullptr);
}

void SharedEventSlot::wait_for(uint64_t version) const {
  if (spin_until([&] { return completed() >= version; }, kSyncSpin)) return;
  for (;;) {
    const uint32_t w = load(&state_->wake);
    if (completed() >= version) return;
    // Returns at once if a completion bumped the word since it was read; the timeout only
    // bounds the sleep should a process die between its two steps of complete().
    const struct timespec timeout { 0, 100 * 1000 * 1000 };
    futex(&state_->wake, FUTEX_WAIT, w, &timeout);
  }
}

std::shared_ptr<SharedEventSlot> create_shared_event(int device, IpcEventHandle* handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  if (!r.file) {
    uint64_t inode = 0;
    void* mapping = nullptr;
    const int fd =
        detail::create_mapped_memory_file("accel-ipc-events", kFileBytes, &inode, &mapping);
    ACCEL_RT_CHECK(fd >= 0, DriverError,
                   "host driver: cannot make the interprocess event file: ", std::strerror(errno));
    r.fd = fd;
    r.inode = inode;
    r.file = own_mapping(mapping);
  }
  SharedEventState* all = slots(r.file);
  for (uint32_t i = 0; i < kSlots; ++i) {
    const uint32_t slot = (r.cursor + i) % kSlots;
    SharedEventState* s = &all[slot];
    uint32_t expected = 0;
    // A slot no event holds, here or in another process (they only give references back).
    if (!__atomic_compare_exchange_n(&s->refs, &expected, 1u, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
      continue;
    }
    __atomic_store_n(&s->recorded, uint64_t{0}, __ATOMIC_RELEASE);
    __atomic_store_n(&s->done, uint64_t{0}, __ATOMIC_RELEASE);
    const uint64_t generation = __atomic_add_fetch(&s->generation, uint64_t{1}, __ATOMIC_ACQ_REL);
    r.cursor = (slot + 1) % kSlots;
    HandleData h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.device = device;
    h.fd = r.fd;
    h.pid = ::getpid();
    h.inode = r.inode;
    h.generation = generation;
    h.slot = slot;
    *handle = IpcEventHandle{};
    std::memcpy(handle->bytes, &h, sizeof(h));
    return std::make_shared<SharedEventSlot>(s, r.file);
  }
  ACCEL_RT_THROW(OutOfMemoryError, "host driver: ", kSlots,
                 " interprocess events of this process are alive (here or opened by other "
                 "processes); destroy some first");
}

std::shared_ptr<SharedEventSlot> open_shared_event(int device, const IpcEventHandle& handle) {
  HandleData h{};
  std::memcpy(&h, handle.bytes, sizeof(h));
  ACCEL_RT_CHECK(std::memcmp(h.magic, kMagic, sizeof(kMagic)) == 0, InvalidValueError,
                 "host driver: the handle is not a host driver's event handle");
  ACCEL_RT_CHECK(h.device == device, InvalidValueError,
                 "host driver: the handle names an event of device ", h.device, ", not of device ",
                 device);
  ACCEL_RT_CHECK(h.slot < kSlots, InvalidValueError, "host driver: event slot ", h.slot,
                 " is out of range");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.m);
  std::shared_ptr<void> file;
  if (h.pid == ::getpid() && r.file && h.inode == r.inode) {
    file = r.file;
  } else {
    const auto key = std::make_pair(h.pid, h.inode);
    file = r.peers[key].lock();
    if (!file) {
      std::string why;
      const int fd = detail::open_peer_file(h.pid, h.fd, h.inode, kFileBytes, &why);
      ACCEL_RT_CHECK(fd >= 0, InvalidValueError, "host driver: the events of process ", h.pid, ": ",
                     why);
      file = own_mapping(detail::map_memory_file(fd, kFileBytes));
      ::close(fd);
      ACCEL_RT_CHECK(file != nullptr, DriverError,
                     "host driver: cannot map the interprocess events of process ", h.pid);
      r.peers[key] = file;
    }
  }
  SharedEventState* s = &slots(file)[h.slot];
  // A reference only while the creator's event (or another opened one) still holds the slot,
  // and while it is still the same event.
  uint32_t refs = load(&s->refs);
  do {
    ACCEL_RT_CHECK(refs > 0, InvalidValueError,
                   "host driver: the event this handle names was destroyed by its process");
  } while (!__atomic_compare_exchange_n(&s->refs, &refs, refs + 1, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE));
  auto slot = std::make_shared<SharedEventSlot>(s, std::move(file));
  ACCEL_RT_CHECK(load(&s->generation) == h.generation, InvalidValueError,
                 "host driver: the event this handle names was destroyed by its process");
  return slot;
}

std::shared_ptr<HostEvent> create_ipc_event(int device) {
  auto ev = std::make_shared<HostEvent>();
  ev->device = device;
  ev->shared = create_shared_event(device, &ev->ipc_handle);
  return ev;
}

IpcEventHandle ipc_event_handle(const HostEvent& event) {
  ACCEL_RT_CHECK(event.shared != nullptr, InvalidValueError,
                 "host driver: the event was not created as an interprocess event");
  return event.ipc_handle;
}

std::shared_ptr<HostEvent> open_ipc_event(int device, const IpcEventHandle& handle) {
  auto ev = std::make_shared<HostEvent>();
  ev->device = device;
  ev->shared = open_shared_event(device, handle);
  ev->ipc_handle = handle;
  return ev;
}

}  // namespace accel::rt::host
