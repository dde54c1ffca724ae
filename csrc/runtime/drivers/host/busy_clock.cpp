#include "runtime/drivers/host/busy_clock.h"

#include <algorithm>

namespace accel::rt::host {
namespace {
int64_t ns(BusyClock::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
constexpr int64_t kBucketNs = BusyClock::kBucket.count();
}  // namespace

void BusyClock::begin_at(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(m_);
  if (active_++ == 0) since_ = ns(now);
}

void BusyClock::end_at(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(m_);
  if (active_ == 0) return;  // unbalanced: ignore rather than count garbage
  if (--active_ == 0) add_locked(since_, ns(now));
}

void BusyClock::add_locked(int64_t from, int64_t to) {
  if (!init_) {
    bucket_.fill(-1);
    init_ = true;
  }
  for (int64_t b = from / kBucketNs; from < to; ++b) {
    const int64_t stop = std::min(to, (b + 1) * kBucketNs);
    const std::size_t slot = static_cast<std::size_t>(b % kBuckets);
    if (bucket_[slot] != b) {
      bucket_[slot] = b;
      busy_[slot] = 0;
    }
    busy_[slot] += stop - from;
    from = stop;
  }
}

int BusyClock::percent_at(Clock::time_point when, std::chrono::nanoseconds window) const {
  const int64_t now = ns(when);
  const int64_t span = std::clamp<int64_t>(window.count(), kBucketNs, (kBuckets - 2) * kBucketNs);
  const int64_t first = (now - span) / kBucketNs;
  const int64_t start = first * kBucketNs;
  int64_t busy = 0;
  std::lock_guard<std::mutex> lock(m_);
  if (init_) {
    for (int64_t b = first; b <= now / kBucketNs; ++b) {
      const std::size_t slot = static_cast<std::size_t>(b % kBuckets);
      if (bucket_[slot] == b) busy += busy_[slot];
    }
  }
  if (active_ > 0) busy += now - std::max(since_, start);  // the interval still open
  const int64_t period = std::max<int64_t>(now - start, 1);
  return static_cast<int>(std::clamp<int64_t>((busy * 100 + period / 2) / period, 0, 100));
}

}  // namespace accel::rt::host
