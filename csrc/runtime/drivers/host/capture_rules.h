// The captures underway on the host driver and CUDA's rule for the calls it counts as
// "potentially unsafe" while one is (allocating and freeing memory, querying or waiting for
// streams and events): refused while this thread began a capture that is not relaxed or, unless
// this thread's mode is thread-local, while another thread's global capture is underway; never
// in relaxed thread mode. CUDA then returns cudaErrorStreamCaptureUnsupported; here the call
// throws CaptureError (ErrorCode::CaptureUnsupported).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/types.h"

namespace accel::rt::host {

struct Capture;

class CaptureRules {
 public:
  // Throws CaptureError naming `call` where the rule refuses it now.
  void check_safe(const char* call) {
    if (capturing_.load(std::memory_order_acquire)) check_underway(call);
  }
  void add(std::shared_ptr<Capture> cap);
  void forget(const Capture* cap);

  // The calling thread's mode (cudaThreadExchangeStreamCaptureMode): sets it, returns the old.
  static CaptureMode exchange_thread_mode(CaptureMode mode);

 private:
  void check_underway(const char* call);

  std::mutex m_;
  std::vector<std::shared_ptr<Capture>> captures_;  // underway
  std::atomic<bool> capturing_{false};
};

}  // namespace accel::rt::host
