// DDP's timer for accel (c10d's TimerRegistry, keyed by device type): the forward, backward
// compute and communication times DDP logs (DistributedDataParallel._get_ddp_logging_data(),
// avg_*_time) measured with timing events on the current accel stream, as CUDA's timer does
// with CUDA events.
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>
#include <optional>

#include "device/common.h"

namespace accel::distributed {
namespace {

class AccelTimer final : public c10d::Timer {
 public:
  explicit AccelTimer(c10::Device device) : device_(device.index() < 0 ? 0 : device.index()) {}

  ~AccelTimer() override {
    for (auto& e : events_) {
      if (!e.recorded) continue;
      try {
        rt::event_destroy(e.event);
      } catch (...) {
      }
    }
  }

  void record(Event event) override {
    c10d::Timer::record(event);  // the host-side timestamp DDP also reads
    auto& slot = events_.at(static_cast<size_t>(event));
    device::call([&] {
      if (!slot.recorded) slot.event = rt::event_create(device_, /*enable_timing=*/true);
      rt::event_record(slot.event, rt::current_stream(device_));
    });
    slot.recorded = true;
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    const auto& a = events_.at(static_cast<size_t>(start));
    const auto& b = events_.at(static_cast<size_t>(end));
    if (!a.recorded || !b.recorded) return std::nullopt;
    const float ms = device::call([&] {
      rt::event_synchronize(a.event);
      rt::event_synchronize(b.event);
      return rt::event_elapsed_time(a.event, b.event);
    });
    if (ms < 0) return std::nullopt;  // recorded out of order (DDP skips such iterations)
    return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
  }

 private:
  struct Slot {
    rt::Event event{};
    bool recorded = false;
  };
  int device_;
  std::array<Slot, 5> events_{};  // one per c10d::Timer::Event
};

}  // namespace
}  // namespace accel::distributed

namespace c10d {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, accel::distributed::AccelTimer);
}  // namespace c10d
