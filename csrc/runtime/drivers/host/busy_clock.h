// How busy a host-driver device is: the share of recent time during which at least one of its
// streams ran a task (what nvidia-smi's GPU utilization is for a GPU: time during which at
// least one kernel ran). Stream workers bracket each batch of tasks with begin()/end(); the
// union of those intervals is summed into 100 ms buckets, so the clock's memory is fixed
// however many tasks run.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace accel::rt::host {

class BusyClock {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::nanoseconds kBucket{100'000'000};
  static constexpr int kBuckets = 16;

  // A worker starts (ends) running tasks. Intervals of several workers count once.
  void begin() { begin_at(Clock::now()); }
  void end() { end_at(Clock::now()); }
  // The percentage (0 to 100) of the sample period ending now during which the device was
  // busy: the last `window` (100 ms to 1.4 s) extended back to the start of its first bucket.
  int percent(std::chrono::nanoseconds window = std::chrono::seconds(1)) const {
    return percent_at(Clock::now(), window);
  }

  // The same with explicit times (tests).
  void begin_at(Clock::time_point now);
  void end_at(Clock::time_point now);
  int percent_at(Clock::time_point now, std::chrono::nanoseconds window) const;

 private:
  void add_locked(int64_t from, int64_t to);  // nanoseconds since the clock's epoch

  mutable std::mutex m_;
  int active_ = 0;
  int64_t since_ = 0;  // when active_ last became nonzero
  std::array<int64_t, kBuckets> busy_{};
  std::array<int64_t, kBuckets> bucket_{};  // which bucket number each slot holds (-1: none)
  bool init_ = false;
};

}  // namespace accel::rt::host
