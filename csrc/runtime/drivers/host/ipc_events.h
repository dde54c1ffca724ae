// The host driver's interprocess events: an event's completion state in a memory file that
// other processes map (private to the host driver; ipc_events.cpp).
//
// One file per process holds every interprocess event it created, a 64-byte slot each. A
// record bumps the slot's record count (in whichever process records it); the marker task
// raises its completed count and wakes waiters through a futex on the slot, which works across
// processes because the mapping is shared. Each event, the creator's and those opened from its
// handle, holds a reference to the slot; a slot returns to the creator's use when none is left.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/types.h"

namespace accel::rt::host {

struct SharedEventState {
  uint64_t recorded;    // records issued, by any process
  uint64_t done;        // highest record completed
  uint64_t generation;  // bumped each time the slot is given to a new event
  uint32_t wake;        // futex word, bumped at each completion
  uint32_t refs;        // events (in any process) on this slot
  unsigned char pad[32];
};
static_assert(sizeof(SharedEventState) == 64);

// One event's hold on a slot: its state, released (the reference given back) when the last
// HostEvent and queued task holding it are gone.
class SharedEventSlot {
 public:
  SharedEventSlot(SharedEventState* state, std::shared_ptr<void> file)
      : state_(state), file_(std::move(file)) {}
  ~SharedEventSlot();
  SharedEventSlot(const SharedEventSlot&) = delete;
  SharedEventSlot& operator=(const SharedEventSlot&) = delete;

  SharedEventState* state() const { return state_; }
  uint64_t issue_record();
  uint64_t last_record() const;
  uint64_t completed() const;
  void complete(uint64_t version);
  void wait_for(uint64_t version) const;

 private:
  SharedEventState* state_;
  std::shared_ptr<void> file_;  // keeps the mapping
};

// A slot of this process's event file for a new event of `device`, and its handle.
std::shared_ptr<SharedEventSlot> create_shared_event(int device, IpcEventHandle* handle);
// The slot another process's handle names (mapped here once per file), for `device`.
std::shared_ptr<SharedEventSlot> open_shared_event(int device, const IpcEventHandle& handle);

}  // namespace accel::rt::host
