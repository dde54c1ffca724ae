// PyTorch's profiler stubs for PrivateUse1 (torch::profiler::impl::registerPrivateUse1Methods):
// what the legacy custom-device profiler uses, torch.autograd.profiler.profile(use_device=
// "accel") without Kineto (ProfilerState::KINETO_PRIVATEUSE1_FALLBACK): a timing event recorded
// on the current accel stream when each operator starts and ends, and the time between them as
// the operator's device time. (torch.profiler with ProfilerActivity.PrivateUse1 uses the Kineto
// child profiler instead: kineto_profiler.cpp.)
#include <c10/core/Event.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

#include "device/common.h"

namespace accel::profiler {
namespace {

class Stubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const int d = device::call([] { return rt::get_device(); });
    if (device != nullptr) *device = static_cast<c10::DeviceIndex>(d);
    auto e = std::make_shared<c10::Event>(device::kAccel, c10::EventFlag::BACKEND_DEFAULT);
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    e->record(device::to_c10(device::call([&] { return rt::current_stream(d); })));
    *event = std::static_pointer_cast<void>(e);
  }

  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const auto* a = static_cast<const c10::Event*>(start->get());
    const auto* b = static_cast<const c10::Event*>(end->get());
    a->synchronize();
    b->synchronize();
    return static_cast<float>(a->elapsedTime(*b) * 1000.0);  // microseconds
  }

  // Range annotations belong to a tool like NVTX; accel's ranges are torch.profiler's own
  // (torch.accel.profiler), so these have nothing to add.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    device::call([&] {
      const int previous = rt::get_device();
      for (int d = 0; d < rt::device_count(); ++d) {
        rt::set_device(d);
        op(d);
      }
      rt::set_device(previous);
    });
  }

  void synchronize() const override {
    device::call([] {
      for (int d = 0; d < rt::device_count(); ++d) rt::device_synchronize(d);
    });
  }
};

struct Registrar {
  Registrar() {
    static Stubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} registrar;

}  // namespace
}  // namespace accel::profiler
