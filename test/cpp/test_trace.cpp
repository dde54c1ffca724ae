// Task tracing for profilers (runtime/trace.h): what ran, where, when, launched under which tag.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "test_util.h"

namespace accel::rt {
namespace {

TEST(Trace, RecordsEachTaskWithItsStreamLabelTagAndTimes) {
  SKIP_UNLESS_HOST_DRIVER();
  Stream side = stream_create();
  trace_start();
  trace_push_tag(7);
  launch_host_func(
      default_stream(0), [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); },
      "first");
  trace_push_tag(8);
  std::string transient = "side task";  // the label may not outlive the launch
  launch_host_func(
      side, [] {}, transient.c_str());
  transient.assign("overwritten");
  trace_pop_tag();
  launch_host_func(
      default_stream(0), [] {}, "second");
  trace_pop_tag();
  launch_host_func(
      default_stream(0), [] {}, nullptr);
  device_synchronize(0);
  std::vector<trace::TaskRecord> records = trace_stop();
  ASSERT_EQ(records.size(), 4u);
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  auto find = [&](const std::string& label) {
    auto it = std::find_if(records.begin(), records.end(),
                           [&](const auto& r) { return r.label == label; });
    EXPECT_NE(it, records.end()) << label;
    return *it;
  };
  const auto first = find("first");
  const auto side_task = find("side task");
  const auto second = find("second");
  const auto untagged = find("task");
  EXPECT_EQ(first.tag, 7u);
  EXPECT_EQ(side_task.tag, 8u);
  EXPECT_EQ(second.tag, 7u);
  EXPECT_EQ(untagged.tag, 0u);
  EXPECT_EQ(first.stream, 0u);
  EXPECT_EQ(side_task.stream, side.id());
  EXPECT_EQ(first.device, 0);
  EXPECT_GE(first.end_ns - first.start_ns, 2'000'000);
  // One stream runs its tasks in order, without overlap.
  EXPECT_LE(first.end_ns, second.start_ns);
  EXPECT_LE(second.end_ns, untagged.start_ns);
  stream_destroy(side);
}

TEST(Trace, CopiesAndFillsAreRecordedBetweenTheirMarkers) {
  SKIP_UNLESS_HOST_DRIVER();
  std::vector<float> host(1 << 16, 1.0f);
  void* dev = malloc(host.size() * sizeof(float));
  trace_start();
  trace_push_tag(3);
  memcpy_async(dev, host.data(), host.size() * sizeof(float), CopyKind::HostToDevice,
               default_stream(0));
  memset_async(dev, 0, 64, default_stream(0));
  trace_pop_tag();
  memcpy(host.data(), dev, host.size() * sizeof(float), CopyKind::DeviceToHost);
  const auto records = trace_stop();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].kind, trace::Kind::Memcpy);
  EXPECT_EQ(records[0].label, "Memcpy HtoD");
  EXPECT_EQ(records[0].tag, 3u);
  EXPECT_EQ(records[1].kind, trace::Kind::Memset);
  EXPECT_EQ(records[2].label, "Memcpy DtoH");
  EXPECT_EQ(records[2].tag, 0u);
  for (const auto& r : records) {
    EXPECT_GT(r.start_ns, 0);
    EXPECT_LE(r.start_ns, r.end_ns);
  }
  EXPECT_LE(records[0].end_ns, records[1].start_ns);
  EXPECT_EQ(host[0], 0.0f);  // the fill ran after the copy, in stream order
  EXPECT_EQ(host.back(), 1.0f);
  free(dev);
}

TEST(Trace, RecordsNothingWhenOffAndDropsTagsOfAnEarlierRecording) {
  SKIP_UNLESS_HOST_DRIVER();
  launch_host_func(
      default_stream(0), [] {}, "before");
  device_synchronize(0);
  trace_start();
  trace_push_tag(5);  // never popped: an earlier recording torn down mid-operator
  EXPECT_TRUE(trace_stop().empty());
  trace_start();
  launch_host_func(
      default_stream(0), [] {}, "later");
  device_synchronize(0);
  const auto records = trace_stop();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].tag, 0u);  // the stale tag does not leak into this recording
  trace_pop_tag();                // popping with nothing current is harmless
  trace_pop_tag();
}

TEST(Trace, CapturedTasksAreNotWrapped) {
  SKIP_UNLESS_HOST_DRIVER();
  Stream s = stream_create();
  Graph g = graph_create();
  trace_start();
  graph_capture_begin(g, s);
  int runs = 0;
  launch_host_func(
      s, [&runs] { ++runs; }, "captured");
  graph_capture_end(g);
  graph_replay(g, s);
  stream_synchronize(s);
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(trace_stop().empty());
  graph_destroy(g);
  stream_destroy(s);
}

}  // namespace
}  // namespace accel::rt
