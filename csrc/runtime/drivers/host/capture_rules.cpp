#include "runtime/drivers/host/capture_rules.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "runtime/drivers/host/host_stream.h"

namespace accel::rt::host {
namespace {

thread_local CaptureMode tls_capture_mode = CaptureMode::Global;

}  // namespace

void CaptureRules::add(std::shared_ptr<Capture> cap) {
  std::lock_guard<std::mutex> lock(m_);
  captures_.push_back(std::move(cap));
  capturing_.store(true, std::memory_order_release);
}

void CaptureRules::forget(const Capture* cap) {
  std::lock_guard<std::mutex> lock(m_);
  captures_.erase(std::remove_if(captures_.begin(), captures_.end(),
                                 [&](const auto& c) { return c.get() == cap; }),
                  captures_.end());
  capturing_.store(!captures_.empty(), std::memory_order_release);
}

CaptureMode CaptureRules::exchange_thread_mode(CaptureMode mode) {
  std::swap(mode, tls_capture_mode);
  return mode;
}

void CaptureRules::check_underway(const char* call) {
  const CaptureMode mine = tls_capture_mode;
  if (mine == CaptureMode::Relaxed) return;
  const std::thread::id me = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(m_);
  for (const auto& cap : captures_) {
    if (cap->mode == CaptureMode::Relaxed) continue;
    const bool own = cap->thread == me;
    if (own || (mine == CaptureMode::Global && cap->mode == CaptureMode::Global)) {
      throw CaptureError(ErrorCode::CaptureUnsupported,
                         detail::concat("host driver: ", call,
                                        " is not allowed while a graph capture is underway "
                                        "(capture mode ",
                                        capture_mode_name(cap->mode), ", begun by ",
                                        own ? "this" : "another", " thread)"),
                         __FILE__, __LINE__);
    }
  }
}

}  // namespace accel::rt::host
