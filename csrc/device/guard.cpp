// c10::impl::DeviceGuardImplInterface for accel: device guards, torch.Stream, torch.Event and
// torch.accelerator all come through here to the runtime.
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "device/common.h"

namespace accel::device {
namespace {

rt::Event as_event(void* e) {
  return rt::Event::from_bits(reinterpret_cast<uintptr_t>(e));
}

// adopt_event's runtime event for the record() it calls (0: none).
thread_local uint64_t tls_adopted_event = 0;

class AccelGuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kAccel; }

  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return c10::Device(kAccel, static_cast<c10::DeviceIndex>(
                                   call([&] { return rt::exchange_device(d.index()); })));
  }

  c10::Device getDevice() const override { return c10::Device(kAccel, current_device()); }

  void setDevice(c10::Device d) const override {
    check(d);
    call([&] { rt::set_device(d.index()); });
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      rt::set_device(d.index());
    } catch (...) {  // the caller cannot handle errors here (guard destructors)
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    return call([&] { return to_c10(rt::current_stream(resolve_device(d.index()))); });
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return call([&] { return to_c10(rt::default_stream(resolve_device(d.index()))); });
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return call([&] { return to_c10(rt::stream_from_pool(resolve_device(d.index()), priority)); });
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return call([&] {
      const int priority = high_priority ? rt::stream_priority_range().second : 0;
      return to_c10(rt::stream_from_pool(resolve_device(d.index()), priority));
    });
  }

  void* getStreamNativeHandle(const c10::Stream s) const override {
    return call([&] { return rt::stream_native_handle(to_rt(s)); });
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    return call([&] {
      const rt::Stream previous = rt::current_stream(s.device_index());
      rt::set_current_stream(to_rt(s));
      return to_c10(previous);
    });
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(rt::device_count_noexcept());
  }

  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check(d);
    resolve_device(d.index());  // an index past the last device raises, as every other query
    c10::DeviceCapability cap;  // every dtype but the quantized ones
    cap.capability_data.supported_scalar_types.has_QInt8 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt8 = 0;
    cap.capability_data.supported_scalar_types.has_QInt32 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt4x2 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt2x4 = 0;
    return cap;
  }

  // Events: the runtime event handle is kept in the void* slot, created on first record.
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "accel: the event was recorded on device ", static_cast<int>(device_index),
                " and cannot be recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    if (*event == nullptr && tls_adopted_event != 0) {  // adopt_event: no record
      *event = reinterpret_cast<void*>(static_cast<uintptr_t>(tls_adopted_event));
      tls_adopted_event = 0;
      return;
    }
    call([&] {
      if (*event == nullptr) {
        const rt::Event e =
            rt::event_create(stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT);
        *event = reinterpret_cast<void*>(static_cast<uintptr_t>(e.bits()));
      }
      rt::event_record(as_event(*event), to_rt(stream));
    });
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    call([&] { rt::stream_wait_event(to_rt(stream), as_event(event)); });
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    return call([&] { return rt::event_query(as_event(event)); });
  }

  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr) return;
    try {
      rt::event_destroy(as_event(event));
    } catch (...) {
    }
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) return;
    call([&] { rt::event_synchronize(as_event(event)); });
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "accel: both events must be recorded before measuring the time between them");
    return call([&] {
      return static_cast<double>(rt::event_elapsed_time(as_event(start), as_event(end)));
    });
  }

  bool queryStream(const c10::Stream& stream) const override {
    return call([&] { return rt::stream_query(to_rt(stream)); });
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    call([&] { rt::stream_synchronize(to_rt(stream)); });
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    call([&] { rt::device_synchronize(resolve_device(device_index)); });
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    if (data_ptr.get() == nullptr) return;
    call([&] { rt::record_stream(data_ptr.get(), to_rt(stream)); });
  }

 private:
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kAccel, "accel device guard used with a ", d.type(), " device");
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, AccelGuardImpl);

}  // namespace

void adopt_event(c10::Event& event, rt::Event e, const c10::Stream& stream) {
  TORCH_CHECK(event.eventId() == nullptr, "adopt_event: the event already holds one");
  tls_adopted_event = e.bits();
  try {
    event.record(stream);
  } catch (...) {
    tls_adopted_event = 0;
    throw;
  }
  TORCH_CHECK(tls_adopted_event == 0 && event.eventId() != nullptr,
              "adopt_event: the event was not adopted");
}
}  // namespace accel::device
