// The host driver's utilization clock, with explicit times.
#include <gtest/gtest.h>

#include <chrono>

#include "runtime/drivers/host/busy_clock.h"

namespace accel::rt::host {
namespace {

using std::chrono::milliseconds;
using T = BusyClock::Clock::time_point;

// A time on a bucket boundary, far from the clock's epoch.
T at(int64_t ms) {
  return T(std::chrono::seconds(1000) + milliseconds(ms));
}

TEST(BusyClock, IdleIsZeroAndAlwaysBusyIsHundred) {
  BusyClock c;
  EXPECT_EQ(c.percent_at(at(0), std::chrono::seconds(1)), 0);
  c.begin_at(at(0));
  EXPECT_EQ(c.percent_at(at(2000), std::chrono::seconds(1)), 100);  // still running
  c.end_at(at(2000));
  EXPECT_EQ(c.percent_at(at(2000), std::chrono::seconds(1)), 100);
  EXPECT_EQ(c.percent_at(at(4000), std::chrono::seconds(1)), 0);  // the busy time aged out
}

TEST(BusyClock, ThePeriodIsTheWindowExtendedToItsFirstBucket) {
  BusyClock c;
  c.begin_at(at(100));
  c.end_at(at(400));                                               // 300 ms
  EXPECT_EQ(c.percent_at(at(1000), std::chrono::seconds(1)), 30);  // period [0, 1000)
  // At 1050 the period starts at bucket 0 still (1.05 s long): 300/1050.
  EXPECT_EQ(c.percent_at(at(1050), std::chrono::seconds(1)), 29);
  // At 1150 it starts at bucket 1 (100 ms): the whole interval is in buckets 1 to 3.
  EXPECT_EQ(c.percent_at(at(1150), std::chrono::seconds(1)), 29);
  EXPECT_EQ(c.percent_at(at(1500), std::chrono::seconds(1)), 0);
}

TEST(BusyClock, OverlappingWorkersCountOnce) {
  BusyClock c;
  c.begin_at(at(0));
  c.begin_at(at(100));
  c.end_at(at(300));  // still busy: the first worker runs
  c.end_at(at(500));
  c.begin_at(at(700));
  c.end_at(at(800));
  EXPECT_EQ(c.percent_at(at(1000), std::chrono::seconds(1)), 60);
}

TEST(BusyClock, AnIntervalAcrossBucketsIsSplitAndUnbalancedEndsAreIgnored) {
  BusyClock c;
  c.end_at(at(10));  // no begin: nothing
  c.begin_at(at(50));
  c.end_at(at(1050));                                              // 1 s across 11 buckets
  EXPECT_EQ(c.percent_at(at(1100), std::chrono::seconds(1)), 95);  // [100, 1100): 950 ms
  EXPECT_EQ(c.percent_at(at(1100), milliseconds(100)), 50);        // [1000, 1100): 50 ms
}

}  // namespace
}  // namespace accel::rt::host
