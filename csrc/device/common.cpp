#include "device/common.h"

#include <atomic>
#include <string>

namespace accel::device {

namespace {
std::atomic<CaptureErrorThrower> g_capture_thrower{nullptr};
}  // namespace

void set_capture_error_thrower(CaptureErrorThrower thrower) {
  g_capture_thrower.store(thrower);
}

void rethrow_as_torch(const rt::Error& e, const char* context) {
  std::string msg = context != nullptr ? std::string(context) + ": " + e.what() : e.what();
  switch (e.code()) {
    case rt::ErrorCode::CaptureUnsupported:
    case rt::ErrorCode::CaptureInvalidated:
    case rt::ErrorCode::CaptureUnjoined:
      if (CaptureErrorThrower thrower = g_capture_thrower.load()) thrower(msg);
      TORCH_CHECK(false, msg);
    case rt::ErrorCode::OutOfMemory: TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    case rt::ErrorCode::NotSupported: TORCH_CHECK_NOT_IMPLEMENTED(false, msg);
    case rt::ErrorCode::DeviceLost:  // torch.AcceleratorError, as CUDA's sticky errors raise
      throw c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                  static_cast<int32_t>(e.code()), msg);
    default: TORCH_CHECK(false, msg);
  }
}

c10::DeviceIndex current_device() {
  return call([] { return static_cast<c10::DeviceIndex>(rt::get_device()); });
}

c10::DeviceIndex resolve_device(c10::DeviceIndex index) {
  if (index < 0) return current_device();
  const int count = rt::device_count_noexcept();
  TORCH_CHECK(index < count, "accel: invalid device index ", static_cast<int>(index), ": ",
              count == 0
                  ? std::string("no accel device is available (") + rt::init_error() + ")"
                  : "there are " + std::to_string(count) + " accel devices (valid indices: 0 to " +
                        std::to_string(count - 1) + ")");
  return index;
}

}  // namespace accel::device
