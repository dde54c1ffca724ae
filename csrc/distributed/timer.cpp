// DDP's timer for accel (c10d's TimerRegistry, keyed by device type): the forward, backward
// compute and communication times DDP logs (DistributedDataParallel._get_ddp_logging_data(),
// avg_*_time) measured with timing events on the current accel stream, as CUDA's timer does
// with CUDA events.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <c10/core/Event.h>

#include <array>
#include <optional>

#include "device/common.h"

namespace accel::distributed {
namespace {

class AccelTimer final : public c10d::Timer {
 public:
  explicit AccelTimer(c10::Device device) : device_(device.index() < 0 ? 0 : device.index()) {}

  void record(Event event) override {
    c10d::Timer::record(event);  // the host-side timestamp DDP also reads
    auto& e = events_.at(static_cast<size_t>(event));
    if (!e) e.emplace(device::kAccel, c10::EventFlag::BACKEND_DEFAULT);  // with timing
    e->record(device::to_c10(device::call([&] { return rt::current_stream(device_); })));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto& a = events_.at(static_cast<size_t>(start));
    const auto& b = events_.at(static_cast<size_t>(end));
    if (!a || !b) return std::nullopt;
    a->synchronize();
    b->synchronize();
    const double ms = a->elapsedTime(*b);
    if (ms < 0) return std::nullopt;  // recorded out of order (DDP skips such iterations)
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  int device_;
  std::array<std::optional<c10::Event>, 5> events_;  // one per c10d::Timer::Event
};

}  // namespace
}  // namespace accel::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, accel::distributed::AccelTimer);
}  // namespace c10d
