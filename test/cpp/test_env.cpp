// Configuration from the environment and start-up failures. Each ctest entry runs these in a
// fresh process with its own ACCEL_* variables; elsewhere they skip.
#include <atomic>
#include <cstdlib>

#include "test_util.h"

namespace accel::rt {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

TEST(EnvConfig, DevicesAndCapacityFollowTheEnvironment) {
  if (env("ACCEL_HOST_DEVICES") != "3" || env("ACCEL_HOST_MEMORY") != "64M") {
    GTEST_SKIP() << "runs with ACCEL_HOST_DEVICES=3 ACCEL_HOST_MEMORY=64M";
  }
  EXPECT_EQ(device_count(), 3);
  for (int d = 0; d < 3; ++d) EXPECT_EQ(get_device_properties(d).total_memory, 64u << 20);
  EXPECT_EQ(get_device_properties(0).max_kernel_args, 40);
  EXPECT_EQ(get_device_properties(0).max_kernel_buffers, 16);
  EXPECT_RT_ERROR(set_device(3), InvalidDeviceError, "valid indices: 0 to 2");
  // The capacity is enforced: two 40 MiB blocks do not fit in 64 MiB.
  void* a = malloc(40u << 20, default_stream(2));
  EXPECT_RT_ERROR(malloc(40u << 20, default_stream(2)), OutOfMemoryError,
                  "total capacity of 64.00 MiB");
  free(a);
  void* b = malloc(40u << 20, default_stream(2));  // fits again once freed
  free(b);
  EXPECT_EQ(memory_stats(2).num_ooms, 1);
}

TEST(InitFailure, ReportsTheCauseEveryTime) {
  const std::string expected = env("ACCEL_TEST_EXPECT_INIT_ERROR");
  if (expected.empty()) GTEST_SKIP() << "runs with ACCEL_TEST_EXPECT_INIT_ERROR set";
  EXPECT_EQ(init_error(), "");  // not tried yet
  EXPECT_RT_ERROR(init(), InitError, expected);
  EXPECT_RT_ERROR(device_count(), InitError, "the accel runtime failed to start");
  EXPECT_RT_ERROR(malloc(16), InitError, expected);  // sticky
  EXPECT_FALSE(is_initialized());
  EXPECT_EQ(device_count_noexcept(), 0);
  EXPECT_NE(init_error().find(expected), std::string::npos) << init_error();
  EXPECT_EQ(pointer_device(&expected), -1);
  EXPECT_FALSE(is_pinned(&expected));
}

TEST(Plugin, LoadsADriverLibraryByName) {
  if (env("ACCEL_DRIVER") != "testdrv") GTEST_SKIP() << "runs with ACCEL_DRIVER=testdrv";
  EXPECT_STREQ(driver_name(), "testdrv");
  EXPECT_EQ(driver_selection(),
            (std::vector<std::pair<std::string, std::string>>{{"testdrv", "selected"}}));
  EXPECT_EQ(device_count(), 1);
  EXPECT_EQ(get_device_properties(0).driver, "testdrv");
  std::vector<float> host = {1.f, 2.f, 3.f};
  float* dev = testing::upload(host);
  EXPECT_EQ(testing::download(dev, 3), host);
  free(dev);
}

TEST(Capabilities, WhatTheDriverLeavesOutIsRefusedByName) {
  if (env("ACCEL_DRIVER") != "limited") GTEST_SKIP() << "runs with ACCEL_DRIVER=limited";
  const DriverCapabilities caps = driver_capabilities();
  EXPECT_FALSE(caps.graphs);
  EXPECT_FALSE(caps.timing_events);
  EXPECT_FALSE(caps.native_handles);
  EXPECT_TRUE(caps.host_functions);
  Stream s = stream_create();
  Graph g = graph_create();
  EXPECT_RT_ERROR(graph_capture_begin(g, s), NotSupportedError,
                  "the limited driver cannot capture streams into graphs");
  EXPECT_RT_ERROR(event_create(0, true), NotSupportedError, "has no timing events");
  EXPECT_RT_ERROR(stream_native_handle(s), NotSupportedError, "no native stream handle");
  // What it can do still works.
  Event e = event_create(0, false);
  std::atomic<int> ran{0};
  launch_host_func(s, [&] { ran = 1; });
  event_record(e, s);
  event_synchronize(e);
  EXPECT_EQ(ran.load(), 1);
  event_destroy(e);
  graph_destroy(g);
  stream_destroy(s);
}

TEST(DriverSelection, AutoKeepsWhyEachDriverWasSkipped) {
  if (env("ACCEL_DRIVER") != "auto" || env("ACCEL_DRIVER_PATH").empty()) {
    GTEST_SKIP() << "runs with ACCEL_DRIVER=auto and a refusing cuda driver in ACCEL_DRIVER_PATH";
  }
  EXPECT_STREQ(driver_name(), "host");
  const auto selection = driver_selection();
  ASSERT_EQ(selection.size(), 3u);
  EXPECT_EQ(selection[0].first, "cuda");
  EXPECT_EQ(selection[0].second, "skipped: no test device is present on this machine");
  EXPECT_EQ(selection[1].first, "level_zero");
  EXPECT_NE(selection[1].second.find("libaccel_driver_level_zero.so does not exist"),
            std::string::npos)
      << selection[1].second;
  EXPECT_EQ(selection[2], (std::pair<std::string, std::string>{"host", "selected"}));
}

}  // namespace
}  // namespace accel::rt
