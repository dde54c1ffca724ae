// Shared pieces of the PyTorch integration: error translation, stream ids, device indices.
#pragma once

#include <c10/core/Event.h>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include <string>
#include <utility>

#include "runtime/runtime.h"

namespace accel::device {

constexpr c10::DeviceType kAccel = c10::DeviceType::PrivateUse1;

// Rethrows a runtime error as the PyTorch exception a user expects: c10::OutOfMemoryError
// (torch.OutOfMemoryError), c10::NotImplementedError, or c10::Error (RuntimeError). `context`
// (e.g. "aten::copy_") is put in front of the message when given.
[[noreturn]] void rethrow_as_torch(const rt::Error& e, const char* context = nullptr);

// Capture errors (a call not allowed while a stream captures, an invalidated or unjoined capture)
// must reach Python as one type, torch_accel.CaptureError, whichever path raised them; the type
// lives in the Python module, which installs a function that throws it (never returning). Without
// it (C++ use), they are c10::Error.
using CaptureErrorThrower = void (*)(const std::string& message);
void set_capture_error_thrower(CaptureErrorThrower thrower);

// Runs f, translating runtime errors.
template <class F>
decltype(auto) call(F&& f, const char* context = nullptr) {
  try {
    return std::forward<F>(f)();
  } catch (const rt::Error& e) {
    rethrow_as_torch(e, context);
  }
}

// c10::Stream ids are the runtime's stream ids (0 for a device's default stream).
inline c10::Stream to_c10(rt::Stream s) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(kAccel, static_cast<c10::DeviceIndex>(s.device())),
                     static_cast<c10::StreamId>(s.id()));
}
inline rt::Stream to_rt(const c10::Stream& s) {
  TORCH_CHECK(s.device_type() == kAccel, "expected an accel stream, got a stream of ",
              s.device_type());
  return rt::Stream::from_id(s.device_index(), static_cast<uint64_t>(s.id()));
}

// The device index meant by `index` (-1: the current device).
c10::DeviceIndex resolve_device(c10::DeviceIndex index);
c10::DeviceIndex current_device();

// Makes `event` (never recorded) hold the runtime event `e` of `stream`'s device, as if it had
// been recorded there but without recording it: c10::Event has no constructor taking a backend
// event, and its waits and queries act only on an event marked for recording. Interprocess
// events (torch.accel.Event(interprocess=True), from_ipc_handle) are made this way, so that
// every torch path (torch.Stream.wait_event, torch.Event.wait) reaches them.
void adopt_event(c10::Event& event, rt::Event e, const c10::Stream& stream);

}  // namespace accel::device
