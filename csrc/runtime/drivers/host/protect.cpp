#include "runtime/drivers/host/protect.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace accel::rt::host {

// Lazy opening (protect.h) ------------------------------------------------------------------

namespace {

// The protecting DeviceMemory objects, for the fault handler (no lock there: slots are set
// before any mapping exists and cleared after the last is gone).
constexpr int kMaxMemories = 256;
std::atomic<DeviceMemory*> g_memories[kMaxMemories];
// The handler that was installed before ours, and ours.
struct sigaction g_previous;
std::mutex g_install_mutex;

void on_fault(int sig, siginfo_t* info, void* context);

// Puts on_fault first for SIGSEGV, chaining to what was there (again if someone installed a
// handler over ours since: Python's faulthandler.enable(), for one).
void install_handler() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  struct sigaction current {};
  ::sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == on_fault) return;
  struct sigaction ours {};
  ours.sa_sigaction = on_fault;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&ours.sa_mask);
  ::sigaction(SIGSEGV, &ours, &g_previous);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  if (info != nullptr && info->si_code > 0) {  // a fault, not a signal someone sent
    for (auto& slot : g_memories) {
      DeviceMemory* mem = slot.load(std::memory_order_acquire);
      if (mem != nullptr && mem->open_on_fault(info->si_addr)) return;  // the access is retried
    }
  }
  // Someone else's: the previous handler takes it (a fault happens again when we return; a sent
  // signal is raised again, delivered once this handler returns).
  const int saved = errno;
  ::sigaction(SIGSEGV, &g_previous, nullptr);
  if (info == nullptr || info->si_code <= 0) ::raise(sig);
  errno = saved;
  (void)context;
}

}  // namespace

DeviceMemory::DeviceMemory(bool protect, int device) : protect_(protect), device_(device) {
  if (!protect_) return;
  for (auto& slot : g_memories) {
    DeviceMemory* empty = nullptr;
    if (slot.compare_exchange_strong(empty, this)) {
      install_handler();
      return;
    }
  }
  ACCEL_RT_THROW(DriverError, "host driver: more than ", kMaxMemories,
                 " devices with protected memory");
}

DeviceMemory::~DeviceMemory() {
  for (auto& slot : g_memories) {
    DeviceMemory* self = this;
    if (slot.compare_exchange_strong(self, nullptr)) break;
  }
  close_files();
}


void* DeviceMemory::map(std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  void* p = map_pages(size, mapping_prot());
  if (p != nullptr) track(reinterpret_cast<uintptr_t>(p), size);
  return p;
}

int DeviceMemory::mapping_prot() const {
  return protect_ ? PROT_NONE : (PROT_READ | PROT_WRITE);  // opened when touched, if at all
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
  bool accessible = !protect_;
  if (protect_) {
    auto it = regions_.lower_bound(base);
    if (it != regions_.begin() && std::prev(it)->first + std::prev(it)->second.size == base) {
      Region& r = std::prev(it)->second;  // grows the range that ends here
      r.size += size;
      accessible = r.count > 0 || r.lazy;
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

bool DeviceMemory::open_on_fault(const void* addr) noexcept {
  // Where this thread last faulted on an open mapping, and when (closes_): a fault there again
  // before the mappings close is not ours to retry forever.
  static thread_local __attribute__((tls_model("initial-exec"))) const void* retried = nullptr;
  static thread_local __attribute__((tls_model("initial-exec"))) uint64_t retried_at = 0;
  std::lock_guard<std::mutex> lock(mutex_);  // never held by a thread touching device memory
  if (all_count_ == 0) return false;
  bool resolved = false;
  for_each_overlap(addr, 1, [&](uintptr_t base, Region& r) {
    if (!r.lazy && r.count == 0) {
      resolved = ::mprotect(reinterpret_cast<void*>(base), r.size, PROT_READ | PROT_WRITE) == 0;
      r.lazy = resolved;
      retried = nullptr;
    } else if (addr != retried || retried_at != closes_) {
      resolved = true;  // opened meanwhile by another thread: retry once
      retried = addr;
      retried_at = closes_;
    }
  });
  return resolved;
}

void DeviceMemory::acquire(const void* ptr, std::size_t size) {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_overlap(ptr, size, [&](uintptr_t base, Region& r) {
    if (r.count++ == 0 && !r.lazy) set_access(base, r.size, true);
  });
}

void DeviceMemory::release(const void* ptr, std::size_t size) {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_overlap(ptr, size, [&](uintptr_t base, Region& r) {
    // A mapping opened lazily stays open until the tasks of unknown footprint end.
    if (r.count > 0 && --r.count == 0 && !r.lazy) set_access(base, r.size, false);
  });
}

void DeviceMemory::acquire_all() {
  if (!protect_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (all_count_++ > 0) return;
  }
  install_handler();  // once more, in case another handler went over ours since
}

void DeviceMemory::release_all() {
  if (!protect_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (all_count_ > 0 && --all_count_ == 0) {
    ++closes_;
    for (auto& [base, r] : regions_) {
      if (!r.lazy) continue;
      r.lazy = false;
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
