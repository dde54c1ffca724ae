// The rules for calls made while a graph capture is underway (CUDA's, for every driver).
#include <sstream>
#include <thread>

#include "runtime/caching_allocator.h"
#include "runtime/internal.h"

namespace accel::rt::detail {

// --- capture rules ------------------------------------------------------------------------

PoolId Runtime::capture_pool(StreamObj& s) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  return s.capture != nullptr ? s.capture->pool : PoolId{};
}

void Runtime::invalidate_and_throw(CaptureState& cs, const std::string& what, const char* why) {
  if (cs.invalidated.empty()) {
    std::ostringstream os;
    os << what << " (called from thread " << std::this_thread::get_id() << ")";
    cs.invalidated = os.str();
  }
  throw CaptureError(
      ErrorCode::CaptureUnsupported,
      concat(what, " is not allowed while a graph capture is underway on ",
             describe(cs.origin->handle()), " (capture mode ", capture_mode_name(cs.mode), "): ",
             why != nullptr ? why : "it would wait for work that is only being recorded, not run",
             ". The capture is now invalidated; graph_capture_end will end it and report this, "
             "after which the "
             "stream is usable again. Capture without this call."),
      __FILE__, __LINE__);
}

void Runtime::refuse_capture(StreamObj& s, const std::string& what, const std::string& why) {
  if (!s.capturing.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  if (s.capture == nullptr) return;
  CaptureState& cs = *s.capture;
  if (cs.invalidated.empty()) {
    std::ostringstream os;
    os << what << " (called from thread " << std::this_thread::get_id() << ")";
    cs.invalidated = os.str();
  }
  throw CaptureError(ErrorCode::CaptureUnsupported,
                     concat(what, " cannot be captured into a graph (", describe(s.handle()),
                            " is capturing): ", why,
                            ". The capture is now invalidated; graph_capture_end will end it and "
                            "report this, after which the stream is usable again."),
                     __FILE__, __LINE__);
}

void Runtime::check_not_capturing(StreamObj& s, const char* call) {
  if (!s.capturing.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  if (s.capture == nullptr) return;
  invalidate_and_throw(*s.capture, concat(call, "(", describe(s.handle()), ")"));
}

namespace {
// Whether capture `cs` forbids a call that may synchronize on the calling thread (whose mode
// the runtime always leaves global outside its own relaxed allocations).
bool forbids(const CaptureState& cs) {
  if (cs.mode == CaptureMode::Relaxed) return false;
  return cs.mode == CaptureMode::Global || cs.thread == std::this_thread::get_id();
}
}  // namespace

bool Runtime::check_device_sync(int device, const char* call) {
  if (!capturing_anywhere()) return false;
  std::lock_guard<std::mutex> lock(capture_mutex);
  for (auto& [id, cs] : live_captures) {
    if (forbids(*cs)) invalidate_and_throw(*cs, concat(call, "(device ", device, ")"));
  }
  return devices[device]->captures.load() > 0;
}

void Runtime::check_unsafe_call(const std::string& what, const char* why) {
  if (!capturing_anywhere()) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  for (auto& [id, cs] : live_captures) {
    if (forbids(*cs)) invalidate_and_throw(*cs, what, why);
  }
}

void Runtime::check_wait_allowed(StreamObj& s, const char* call) {
  if (!capturing_anywhere()) return;  // the name is built only when a capture is underway
  check_unsafe_call(concat(call, "(", describe(s.handle()), ")"), nullptr);
}

void Runtime::check_event_not_captured(EventObj& e, const char* call) {
  const uint64_t id = e.capture_id.load(std::memory_order_acquire);
  if (id == 0) return;
  std::lock_guard<std::mutex> lock(capture_mutex);
  auto it = live_captures.find(id);
  // After the capture the record is a graph node, not work that runs or ran: CUDA refuses such
  // an event until it is recorded again (cudaErrorCapturedEvent), and so does every driver.
  ACCEL_RT_CHECK(it != live_captures.end(), CaptureError, call,
                 ": the event was last recorded during a capture, which has ended (its work runs "
                 "only when the graph replays); record it again outside a capture first");
  invalidate_and_throw(*it->second, concat(call, " on an event recorded during the capture"));
}

void Runtime::keep_for_capture(StreamObj& s, const void* ptr) {
  if (ptr == nullptr || !s.capturing.load(std::memory_order_acquire)) return;
  uint64_t id = 0;
  int device = 0;
  {
    std::lock_guard<std::mutex> lock(capture_mutex);
    if (s.capture == nullptr || !s.capture->used.insert(ptr).second) return;
    id = s.capture->id;
    device = s.capture->device;
  }
  // The allocator takes capture_mutex under its own (check_unsafe_call): never the reverse.
  CachingAllocator& alloc = *devices[device]->allocator;
  uintptr_t base = alloc.keep_segment(ptr);
  const bool pinned = base == 0;  // else device memory
  if (pinned) base = host_allocator->keep_block(ptr);
  if (base == 0) return;
  {
    std::lock_guard<std::mutex> lock(capture_mutex);
    auto it = live_captures.find(id);
    if (it != live_captures.end()) {
      (pinned ? it->second->kept_host : it->second->kept).push_back(base);
      return;
    }
  }
  // The capture ended meanwhile.
  if (pinned) {
    host_allocator->unkeep_blocks({base});
  } else {
    alloc.unkeep_segments({base});
  }
}

}  // namespace accel::rt::detail
