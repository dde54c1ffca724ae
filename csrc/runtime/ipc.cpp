// Interprocess memory: device allocations shared with other processes; and interprocess events.
//
// The exporter asks the driver for a handle of the allocation's segment (CUDA: cudaIpcMemHandle;
// host: its memory file's range) and gives the allocation a counter in its counter file, a memfd
// of 64-bit counters that importers map: each export adds one reference, each import's release
// takes it back. An allocation freed here while its counter is above zero is kept out of reuse
// (the "limbo" of PyTorch's CUDA IPC) until ipc_collect finds its counter at zero. Importers map
// a segment once per process, however many allocations in it they import, and close it with
// the last.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"
#include "runtime/runtime.h"
#include "runtime/shared_file.h"

namespace accel::rt {

using detail::Runtime;

namespace {

constexpr uint32_t kSlots = uint32_t{1} << 16;  // counters per process (512 KiB, sparse)
constexpr std::size_t kCounterBytes = std::size_t{kSlots} * sizeof(uint64_t);

uint64_t load(const uint64_t* c) {
  return __atomic_load_n(c, __ATOMIC_ACQUIRE);
}

struct Exported {
  int device;
  uint32_t slot;
  bool freed;  // freed here while held elsewhere: waits for ipc_collect
};

struct Segment {  // an imported segment's mapping here
  int device;
  void* base;
  std::size_t size;
  int users;
  bool own;  // this process's own segment: no mapping was opened (CUDA refuses to open it)
};

struct Imported {
  std::vector<char> segment_key;
  uint64_t* counter;  // in the exporter's counter file
  int count;
};

struct State {
  std::mutex m;
  // This process's counter file.
  int fd = -1;
  uint64_t inode = 0;
  uint64_t* counters = nullptr;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  std::map<const void*, Exported> exported;                                 // by allocation start
  std::map<std::vector<char>, std::pair<void*, std::size_t>> own_segments;  // key -> base, size
  std::atomic<std::size_t> exported_count{0};
  // Importer side: counter files of other processes, segments and imports.
  std::map<std::pair<int64_t, uint64_t>, uint64_t*> counter_files;  // (pid, inode)
  std::map<std::vector<char>, Segment> segments;                    // (device, handle bytes)
  std::map<const void*, Imported> imported;
  std::atomic<std::size_t> imported_count{0};
};

State& state() {
  static State* s = new State();  // outlives stream workers at exit
  return *s;
}

uint64_t* map_counters(int fd) {
  return static_cast<uint64_t*>(detail::map_memory_file(fd, kCounterBytes));
}

// This process's counter file, made on first export (under st.m).
void ensure_counter_file(State& st) {
  if (st.counters != nullptr) return;
  uint64_t inode = 0;
  void* mapping = nullptr;
  const int fd =
      detail::create_mapped_memory_file("accel-ipc-refcounts", kCounterBytes, &inode, &mapping);
  ACCEL_RT_CHECK(fd >= 0, DriverError,
                 "ipc_export: cannot make the reference counter file: ", std::strerror(errno));
  auto* c = static_cast<uint64_t*>(mapping);
  st.fd = fd;
  st.inode = inode;
  st.counters = c;
}

// Forgets an export that no other process holds (its counter back to the free slots).
std::map<const void*, Exported>::iterator forget_export(
    State& st, std::map<const void*, Exported>::iterator it) {
  st.free_slots.push_back(it->second.slot);
  st.exported_count.fetch_sub(1);
  return st.exported.erase(it);
}

uint32_t take_slot(State& st) {
  if (!st.free_slots.empty()) {
    const uint32_t s = st.free_slots.back();
    st.free_slots.pop_back();
    return s;
  }
  ACCEL_RT_CHECK(st.next_slot < kSlots, OutOfMemoryError, "ipc_export: ", kSlots,
                 " allocations are shared with other processes already; free some of them "
                 "(and call ipc_collect) first");
  return st.next_slot++;
}

// Another process's counter file (or this one's), mapped once (under st.m).
uint64_t* counters_of(State& st, const IpcExport& from) {
  if (from.ref_pid == ::getpid() && from.ref_inode == st.inode && st.counters != nullptr) {
    return st.counters;
  }
  const auto key = std::make_pair(from.ref_pid, from.ref_inode);
  if (auto it = st.counter_files.find(key); it != st.counter_files.end()) return it->second;
  std::string why;
  const int fd =
      detail::open_peer_file(from.ref_pid, from.ref_fd, from.ref_inode, kCounterBytes, &why);
  ACCEL_RT_CHECK(fd >= 0, InvalidValueError, "ipc_import: the reference counters of process ",
                 from.ref_pid, ": ", why);
  uint64_t* c = map_counters(fd);
  ::close(fd);
  ACCEL_RT_CHECK(c != nullptr, DriverError,
                 "ipc_import: cannot map the reference counters of process ", from.ref_pid);
  st.counter_files[key] = c;
  return c;
}

std::vector<char> segment_key(const IpcExport& from) {
  std::vector<char> key(sizeof(int) + sizeof(from.handle.bytes));
  std::memcpy(key.data(), &from.device, sizeof(int));
  std::memcpy(key.data() + sizeof(int), from.handle.bytes, sizeof(from.handle.bytes));
  return key;
}

}  // namespace

IpcExport ipc_export(const void* ptr) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(ptr != nullptr, InvalidPointerError, "ipc_export: the pointer is null");
  ACCEL_RT_CHECK(rt.capabilities.ipc_memory, NotSupportedError, "ipc_export: the ",
                 rt.driver->name(), " driver cannot share device memory with other processes");
  int device = -1;
  detail::CachingAllocator::SegmentView view;
  for (int d = 0; d < rt.num_devices && device < 0; ++d) {
    if (rt.devices[d]->allocator->segment_view(ptr, &view)) device = d;
  }
  ACCEL_RT_CHECK(device >= 0, InvalidPointerError, "ipc_export: ", format_ptr(ptr),
                 " is not in a live device allocation");
  ACCEL_RT_CHECK(view.why_not == nullptr, NotSupportedError, "ipc_export: the allocation at ",
                 format_ptr(view.alloc), " cannot be shared with another process: ", view.why_not);
  stream_synchronize(rt.current_stream_obj(device).handle());
  IpcExport out;
  out.device = device;
  out.handle = rt.driver->ipc_get_mem_handle(device, view.base, view.size);
  out.segment_size = view.size;
  out.offset =
      static_cast<std::size_t>(static_cast<const char*>(ptr) - static_cast<const char*>(view.base));
  State& st = state();
  std::lock_guard<std::mutex> lock(st.m);
  ensure_counter_file(st);
  st.own_segments[segment_key(out)] = {view.base, view.size};
  auto it = st.exported.find(view.alloc);
  if (it == st.exported.end()) {
    it = st.exported.emplace(view.alloc, Exported{device, take_slot(st), false}).first;
    __atomic_store_n(&st.counters[it->second.slot], uint64_t{0}, __ATOMIC_RELEASE);
    st.exported_count.fetch_add(1);
  }
  __atomic_fetch_add(&st.counters[it->second.slot], uint64_t{1}, __ATOMIC_ACQ_REL);
  out.ref_pid = ::getpid();
  out.ref_fd = st.fd;
  out.ref_inode = st.inode;
  out.ref_slot = it->second.slot;
  return out;
}

void* ipc_import(const IpcExport& from) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(rt.capabilities.ipc_memory, NotSupportedError, "ipc_import: the ",
                 rt.driver->name(), " driver cannot map device memory of other processes");
  ACCEL_RT_CHECK(from.device >= 0 && from.device < rt.num_devices, InvalidDeviceError,
                 "ipc_import: the memory is on device ", from.device, ", and ",
                 rt.device_range_text());
  ACCEL_RT_CHECK(from.ref_slot < kSlots, InvalidValueError, "ipc_import: reference counter ",
                 from.ref_slot, " is out of range");
  State& st = state();
  std::lock_guard<std::mutex> lock(st.m);
  uint64_t* counters = counters_of(st, from);
  std::vector<char> key = segment_key(from);
  auto seg = st.segments.find(key);
  if (seg == st.segments.end()) {
    // This process's own export: its memory is here already (as torch's storage cache returns
    // the sender's own storage).
    const bool own = counters == st.counters;
    std::pair<void*, std::size_t> mapped{nullptr, 0};
    if (own) {
      auto it = st.own_segments.find(key);
      ACCEL_RT_CHECK(it != st.own_segments.end(), InvalidValueError,
                     "ipc_import: this process exported no such segment");
      mapped = it->second;
    } else {
      mapped.first = rt.driver->ipc_open_mem_handle(from.device, from.handle, &mapped.second);
      if (mapped.second == 0) mapped.second = from.segment_size;  // the driver cannot tell
    }
    seg = st.segments.emplace(key, Segment{from.device, mapped.first, mapped.second, 0, own}).first;
  }
  if (from.offset >= seg->second.size) {
    if (seg->second.users == 0 && !seg->second.own) {
      rt.driver->ipc_close_mem_handle(from.device, seg->second.base);
      st.segments.erase(seg);
    }
    ACCEL_RT_THROW(InvalidValueError, "ipc_import: offset ", from.offset,
                   " lies past the end of the shared segment");
  }
  ++seg->second.users;
  void* ptr = static_cast<char*>(seg->second.base) + from.offset;
  auto [imp, added] = st.imported.emplace(ptr, Imported{key, &counters[from.ref_slot], 0});
  if (added) st.imported_count.fetch_add(1);
  ++imp->second.count;
  return ptr;
}

void ipc_release(void* ptr) {
  Runtime& rt = Runtime::get();
  State& st = state();
  std::lock_guard<std::mutex> lock(st.m);
  auto it = st.imported.find(ptr);
  ACCEL_RT_CHECK(it != st.imported.end(), InvalidPointerError, "ipc_release: ", format_ptr(ptr),
                 " was not returned by ipc_import (or all its imports were released)");
  Imported& imp = it->second;
  __atomic_fetch_sub(imp.counter, uint64_t{1}, __ATOMIC_ACQ_REL);
  auto seg = st.segments.find(imp.segment_key);
  if (--imp.count == 0) {
    st.imported.erase(it);
    st.imported_count.fetch_sub(1);
  }
  if (seg != st.segments.end() && --seg->second.users == 0) {
    const Segment gone = seg->second;
    st.segments.erase(seg);
    if (!gone.own) rt.driver->ipc_close_mem_handle(gone.device, gone.base);
  }
}

std::size_t ipc_collect(int device) {
  Runtime& rt = Runtime::get();
  if (device != -2) device = rt.resolve_device(device, "ipc_collect");
  State& st = state();
  std::vector<std::pair<int, const void*>> ready;
  {
    std::lock_guard<std::mutex> lock(st.m);
    for (auto it = st.exported.begin(); it != st.exported.end();) {
      const Exported& e = it->second;
      if (e.freed && (device == -2 || e.device == device) && load(&st.counters[e.slot]) == 0) {
        ready.emplace_back(e.device, it->first);
        it = forget_export(st, it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& [d, p] : ready) rt.devices[d]->allocator->free(const_cast<void*>(p));
  return ready.size();
}

std::size_t ipc_pending(int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "ipc_pending");
  State& st = state();
  std::lock_guard<std::mutex> lock(st.m);
  std::size_t n = 0;
  for (const auto& [p, e] : st.exported) n += (e.freed && e.device == d) ? 1 : 0;
  return n;
}

// --- interprocess events --------------------------------------------------------------------

namespace {

// The handles of this process's own interprocess events (CUDA refuses to open them here).
struct OwnEvents {
  std::mutex m;
  std::set<std::string> handles;
};
OwnEvents& own_events() {
  static auto* o = new OwnEvents();  // outlives stream workers at exit
  return *o;
}
std::string handle_key(const IpcEventHandle& h) {
  return std::string(reinterpret_cast<const char*>(h.bytes), sizeof(h.bytes));
}

// A new runtime event on `device` (valid, resolved) around the interprocess driver event that
// `make_driver_event` makes.
detail::EventObj& make_interprocess_event(int device, const char* call,
                                          const std::function<DriverEvent()>& make_driver_event) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(rt.capabilities.ipc_events, NotSupportedError, call, ": the ", rt.driver->name(),
                 " driver has no events that other processes can wait on");
  detail::EventObj* obj = rt.events.acquire(
      [](detail::EventObj&) { return false; },  // never a recycled one: a fresh driver event
      [&](uint32_t slot) {
        auto e = std::make_unique<detail::EventObj>();
        e->slot = slot;
        e->device = device;
        e->de = make_driver_event();
        return e.release();
      });
  obj->interprocess = true;
  // Another process may have recorded it: waits and queries ask the driver.
  obj->recorded.store(true);
  obj->capture_id.store(0);
  obj->live.store(true, std::memory_order_release);
  return *obj;
}

}  // namespace

Event event_create_interprocess(int device) {
  Runtime& rt = Runtime::get();
  const int d = rt.resolve_device(device, "event_create_interprocess");
  detail::EventObj& e = make_interprocess_event(d, "event_create_interprocess",
                                                [&] { return rt.driver->event_create_ipc(d); });
  try {
    e.ipc_handle = rt.driver->ipc_get_event_handle(e.de);
  } catch (...) {
    event_destroy(e.handle());
    throw;
  }
  e.ipc_own = true;
  OwnEvents& own = own_events();
  std::lock_guard<std::mutex> lock(own.m);
  own.handles.insert(handle_key(e.ipc_handle));
  return e.handle();
}

IpcEventHandle event_ipc_handle(Event event) {
  Runtime& rt = Runtime::get();
  detail::EventObj& e = rt.event(event, "event_ipc_handle");
  ACCEL_RT_CHECK(e.interprocess, InvalidValueError,
                 "event_ipc_handle: the event is not an interprocess event; create it with "
                 "interprocess=True (event_create_interprocess)");
  return e.ipc_own ? e.ipc_handle : rt.driver->ipc_get_event_handle(e.de);
}

Event event_open_ipc_handle(int device, const IpcEventHandle& handle) {
  Runtime& rt = Runtime::get();
  ACCEL_RT_CHECK(device >= 0 && device < rt.num_devices, InvalidDeviceError,
                 "event_open_ipc_handle: the event is on device ", device, ", and ",
                 rt.device_range_text());
  {
    OwnEvents& own = own_events();
    std::lock_guard<std::mutex> lock(own.m);
    ACCEL_RT_CHECK(own.handles.count(handle_key(handle)) == 0, InvalidValueError,
                   "event_open_ipc_handle: the handle names an event of this process (CUDA "
                   "opens only other processes' handles); use that event itself");
  }
  return make_interprocess_event(device, "event_open_ipc_handle",
                                 [&] { return rt.driver->ipc_open_event_handle(device, handle); })
      .handle();
}

namespace detail {

void forget_own_ipc_event(const IpcEventHandle& handle) {
  OwnEvents& own = own_events();
  std::lock_guard<std::mutex> lock(own.m);
  own.handles.erase(handle_key(handle));
}

bool ipc_keeps(const void* ptr) {
  State& st = state();
  if (st.exported_count.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard<std::mutex> lock(st.m);
  auto it = st.exported.find(ptr);
  if (it == st.exported.end()) return false;
  ACCEL_RT_CHECK(!it->second.freed, InvalidPointerError, "free(", format_ptr(ptr),
                 "): the allocation was already freed (double free); it waits for other "
                 "processes to release it");
  if (load(&st.counters[it->second.slot]) > 0) {
    it->second.freed = true;
    return true;
  }
  forget_export(st, it);
  return false;
}

int ipc_device_of(const void* ptr) {
  State& st = state();
  if (st.imported_count.load(std::memory_order_acquire) == 0) return -1;
  std::lock_guard<std::mutex> lock(st.m);
  const auto* p = static_cast<const char*>(ptr);
  for (const auto& [key, seg] : st.segments) {
    if (seg.own) continue;  // the allocator's
    const auto* b = static_cast<const char*>(seg.base);
    if (p >= b && p < b + seg.size) return seg.device;
  }
  return -1;
}

}  // namespace detail
}  // namespace accel::rt
