// at::PrivateUse1HooksInterface for accel: availability, devices, pointers, pinned memory,
// generators and storage resizing, as ATen's Context asks for them.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Storage.h>

#include <algorithm>

#include "device/allocator.h"
#include "device/common.h"
#include "device/generator.h"

namespace accel::device {
namespace {

class AccelHooks final : public at::PrivateUse1HooksInterface {
 public:
  // Never throws and never starts a device: cheap enough for import-time checks.
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt::device_count_noexcept() > 0; }

  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return rt::is_initialized() && device_index >= 0 && device_index < rt::device_count_noexcept();
  }

  void init() const override {
    call([] { rt::init(); });
  }

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(rt::device_count_noexcept());
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    call([&] { rt::set_device(device); });
  }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    return static_cast<c10::DeviceIndex>(call([&] { return rt::exchange_device(device); }));
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  c10::Device getDeviceFromPtr(void* data) const override {
    const int device = rt::pointer_device(data);
    TORCH_CHECK(device >= 0, "accel: ", rt::format_ptr(data),
                " is not a pointer into accel device memory");
    return c10::Device(kAccel, static_cast<c10::DeviceIndex>(device));
  }

  bool isPinnedPtr(const void* data) const override { return rt::is_pinned(data); }

  c10::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }

  // Grows or shrinks a storage in stream order: new memory, a device-to-device copy of what
  // fits on the current stream, then the old block is freed behind that copy.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    c10::Allocator* allocator = storage.allocator();
    TORCH_CHECK(allocator != nullptr, "Trying to resize a storage without an allocator");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = allocator->allocate(new_bytes);
    const size_t keep = std::min(storage.nbytes(), new_bytes);
    call(
        [&] {
          if (keep > 0 && storage.data() != nullptr) {
            const rt::Stream stream = rt::current_stream(storage.device().index());
            rt::memcpy_async(fresh.get(), storage.data(), keep, rt::CopyKind::DeviceToDevice,
                             stream);
            rt::record_stream(const_cast<void*>(storage.data()), stream);
          }
        },
        "resizing an accel storage");
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
    storage.unsafeGetStorageImpl()->set_nbytes(new_bytes);
  }
};

// Registered once, when the library is loaded.
[[maybe_unused]] const bool g_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new AccelHooks());
  return true;
}();

}  // namespace
}  // namespace accel::device
