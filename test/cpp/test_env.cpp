// Configuration from the environment and start-up failures. Each ctest entry runs these in a
// fresh process with its own ACCEL_* variables; elsewhere they skip.
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/drivers/cuda/visible_devices.h"
#include "test_util.h"

namespace accel::rt {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

TEST(EnvConfig, DevicesAndCapacityFollowTheEnvironment) {
  if (env("ACCEL_HOST_DEVICES") != "3" || env("ACCEL_HOST_MEMORY") != "64M" ||
      env("ACCEL_NO_MEMORY_CACHING") != "1") {
    GTEST_SKIP() << "runs with ACCEL_HOST_DEVICES=3 ACCEL_HOST_MEMORY=64M "
                    "ACCEL_NO_MEMORY_CACHING=1";
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
  // ACCEL_NO_MEMORY_CACHING=1: what is freed goes back to the driver.
  for (int d = 0; d < 3; ++d) EXPECT_FALSE(memory_caching(d));
  device_synchronize(2);
  EXPECT_EQ(memory_stats(2).reserved_bytes[kAggregate].current, 0);
  EXPECT_EQ(mem_get_info(2).free, 64u << 20);
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

// Counting devices starts nothing (no stream worker, no device context), as
// torch.cuda.device_count does not, so a process may count and then fork workers.
TEST(Probe, CountsDevicesWithoutStarting) {
  const std::string expected = env("ACCEL_TEST_EXPECT_COUNT");
  if (expected.empty()) GTEST_SKIP() << "runs with ACCEL_TEST_EXPECT_COUNT set";
  EXPECT_FALSE(is_initialized());
  EXPECT_EQ(device_count_noexcept(), std::stoi(expected));
  EXPECT_EQ(device_count_noexcept(), std::stoi(expected));
  EXPECT_FALSE(is_initialized());
  EXPECT_EQ(init_error(), "");
  // The start that follows opens the same driver.
  init();
  EXPECT_TRUE(is_initialized());
  EXPECT_EQ(device_count_noexcept(), device_count());
}

TEST(Plugin, LoadsADriverLibraryByName) {
  if (env("ACCEL_DRIVER") != "testdrv") GTEST_SKIP() << "runs with ACCEL_DRIVER=testdrv";
  EXPECT_STREQ(driver_name(), "testdrv");
  EXPECT_EQ(driver_selection(),
            (std::vector<std::pair<std::string, std::string>>{{"testdrv", "selected"}}));
  EXPECT_EQ(device_count(), 2);
  EXPECT_EQ(get_device_properties(1).driver, "testdrv");
  // The UUID comes through the table's device_uuid entry.
  EXPECT_NE(get_device_properties(1).uuid, (std::array<uint8_t, 16>{}));
  EXPECT_NE(get_device_properties(0).uuid, get_device_properties(1).uuid);
  std::vector<float> host = {1.f, 2.f, 3.f};
  float* dev = testing::upload(host);
  EXPECT_EQ(testing::download(dev, 3), host);

  // Memory the runtime did not allocate: the driver's answer (testdrv reports a buffer of its
  // own as device memory, as cudaPointerGetAttributes does for another library's cudaMalloc).
  const std::string path = env("ACCEL_DRIVER_PATH") + "/libaccel_driver_testdrv.so";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << path << " is not loaded";
  auto buffer_fn =
      reinterpret_cast<unsigned char* (*)()>(::dlsym(lib, "accel_test_foreign_buffer"));
  ::dlclose(lib);
  ASSERT_NE(buffer_fn, nullptr);
  float* foreign = reinterpret_cast<float*>(buffer_fn());
  const PointerAttributes fa = pointer_attributes(foreign + 4);
  EXPECT_EQ(fa.type, MemoryType::Device);
  EXPECT_EQ(fa.device, 0);
  EXPECT_FALSE(fa.runtime_allocated);
  const PointerAttributes da = pointer_attributes(dev + 1);
  EXPECT_EQ(da.type, MemoryType::Device);
  EXPECT_TRUE(da.runtime_allocated);
  const PointerAttributes ha = pointer_attributes(host.data());
  EXPECT_EQ(ha.type, MemoryType::Unregistered);
  EXPECT_EQ(ha.device, -1);
  EXPECT_RT_ERROR(pointer_attributes(nullptr), InvalidPointerError, "null");
  // Copies treat it as device memory: DeviceToDevice both ways, and a host kind is refused.
  const float values[3] = {7.f, 8.f, 9.f};
  std::memcpy(foreign, values, sizeof(values));
  memcpy(dev, foreign, sizeof(values), CopyKind::DeviceToDevice);
  EXPECT_EQ(testing::download(dev, 3), (std::vector<float>{7.f, 8.f, 9.f}));
  memcpy(foreign + 8, dev, sizeof(values));  // Default: inferred DeviceToDevice
  EXPECT_EQ(foreign[9], 8.f);
  EXPECT_RT_ERROR(memcpy(dev, foreign, sizeof(values), CopyKind::HostToDevice), InvalidValueError,
                  "is device memory, not host memory");
  free(dev);
}

TEST(Plugin, AdoptsAStreamAnotherLibraryCreated) {
  // testdrv adopts the streams it made for "another library", as the cuda driver adopts a
  // cudaStream_t that torch.cuda or CuPy created.
  if (env("ACCEL_DRIVER") != "testdrv") GTEST_SKIP() << "runs with ACCEL_DRIVER=testdrv";
  const std::string path = env("ACCEL_DRIVER_PATH") + "/libaccel_driver_testdrv.so";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(lib, nullptr) << path << " is not loaded";
  auto make = reinterpret_cast<void* (*)(int)>(::dlsym(lib, "accel_test_foreign_stream"));
  ::dlclose(lib);
  ASSERT_NE(make, nullptr);
  void* native = make(1);
  ASSERT_NE(native, nullptr);
  const Stream s = stream_from_native(native, 1);
  EXPECT_EQ(s.device(), 1);
  EXPECT_FALSE(s.is_default());
  EXPECT_EQ(stream_native_handle(s), native);
  EXPECT_EQ(stream_from_native(native, 1), s) << "asking again gives the same stream";
  EXPECT_RT_ERROR(stream_from_native(native, 0), InvalidValueError, "not of a stream of device 0");
  EXPECT_RT_ERROR(stream_destroy(s), InvalidValueError, "another library created");
  // Work on it is ordered as on any stream, with events to and from accel's own streams.
  Stream mine = stream_create(1);
  std::vector<int> order;
  std::mutex m;
  auto note = [&](int i) {
    std::lock_guard<std::mutex> lock(m);
    order.push_back(i);
  };
  launch_host_func(s, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    note(1);
  });
  Event e = event_create(1);
  event_record(e, s);
  stream_wait_event(mine, e);
  launch_host_func(mine, [&] { note(2); });
  stream_synchronize(mine);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  set_current_stream(s);
  EXPECT_EQ(current_stream(1), s);
  set_current_stream(default_stream(1));
  event_destroy(e);
  stream_destroy(mine);
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

TEST(Plugin, AShorterTableFromAnOlderLibraryLacksOnlyTheNewerEntries) {
  if (env("ACCEL_TEST_BAD_TABLE") != "short")
    GTEST_SKIP() << "runs with ACCEL_TEST_BAD_TABLE=short";
  EXPECT_STREQ(driver_name(), "testdrv");
  EXPECT_EQ(get_device_properties(0).uuid, (std::array<uint8_t, 16>{}));  // device_uuid absent
  std::vector<float> host = {4.f, 5.f};
  float* dev = testing::upload(host);
  EXPECT_EQ(testing::download(dev, 2), host);
  free(dev);
  // oom_hint lies past its table: absent, so out-of-memory errors carry no driver sentence.
  try {
    malloc(std::size_t{5} << 30);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("was needed) on device 0."), std::string::npos) << m;
    EXPECT_EQ(m.find("ACCEL_HOST_MEMORY"), std::string::npos) << m;
  }
}

TEST(DeviceLost, TheFirstLossIsStickyAndFreesStillWork) {
  if (env("ACCEL_DRIVER") != "fragile") GTEST_SKIP() << "runs with ACCEL_DRIVER=fragile";
  Stream s = stream_create();
  void* kept = malloc(1024, s);
  launch_host_func(s, [] { throw std::runtime_error("illegal address at 0x10"); });
  // The failure surfaces at the synchronize as the driver's loss, naming the cause.
  EXPECT_RT_ERROR(stream_synchronize(s), DeviceLostError, "illegal address at 0x10");
  // Every later call is refused with the first loss; releasing memory and handles still works.
  EXPECT_RT_ERROR(stream_synchronize(s), DeviceLostError, "lost the device earlier");
  EXPECT_RT_ERROR(launch_host_func(s, [] {}), DeviceLostError, "illegal address at 0x10");
  EXPECT_RT_ERROR(event_create(0, false), DeviceLostError, "nothing more can run on it");
  free(kept);
  EXPECT_RT_ERROR(empty_cache(0), DeviceLostError, "lost the device earlier");
  stream_destroy(s);
  try {
    stream_synchronize(default_stream(0));
    ADD_FAILURE() << "the device is lost for good";
  } catch (const DeviceLostError& e) {
    EXPECT_EQ(e.code(), ErrorCode::DeviceLost);
    EXPECT_STREQ(error_code_name(e.code()), "device lost");
  }
}

// The cuda driver on the emulated CUDA runtime, whose context dies once the file named by
// CUDA_EMULATOR_LOSE_DEVICE exists (as at an illegal address in a kernel): CUDA then fails every
// call that needs the context, frees and destroys included, with that same error.
TEST(DeviceLost, AGpuFaultIsStickyAndReleasingStillWorks) {
  const std::string trigger = env("CUDA_EMULATOR_LOSE_DEVICE");
  if (env("ACCEL_DRIVER") != "cuda" || trigger.empty()) {
    GTEST_SKIP() << "runs with the emulated cuda driver and CUDA_EMULATOR_LOSE_DEVICE";
  }
  std::remove(trigger.c_str());
  Stream s = stream_create();
  Event e = event_create(0, true);
  void* kept = malloc(1 << 20, s);
  void* pinned = host_malloc(4096);
  memset_async(kept, 1, 1 << 20, s);
  event_record(e, s);
  stream_synchronize(s);
  std::fclose(std::fopen(trigger.c_str(), "w"));  // a kernel faults
  // The first call that sees it names CUDA's error; the device is lost for good.
  EXPECT_RT_ERROR(stream_synchronize(s), DeviceLostError, "cudaErrorIllegalAddress");
  EXPECT_RT_ERROR(memset_async(kept, 0, 16, s), DeviceLostError, "lost the device earlier");
  EXPECT_RT_ERROR(event_query(e), DeviceLostError, "lost the device earlier");
  EXPECT_RT_ERROR(stream_create(), DeviceLostError, "lost the device earlier");
  // Releasing needs no device (CUDA would refuse each call): nothing throws, nothing leaks.
  free(kept);
  host_free(pinned);
  event_destroy(e);
  stream_destroy(s);
  EXPECT_RT_ERROR(empty_cache(0), DeviceLostError, "lost the device earlier");
  EXPECT_EQ(device_count(), 2);  // counting needs no context
  std::remove(trigger.c_str());  // a dead context stays dead
  EXPECT_RT_ERROR(stream_synchronize(default_stream(1)), DeviceLostError,
                  "cudaErrorIllegalAddress");
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

// The cuda driver's count before the start reads CUDA_VISIBLE_DEVICES as CUDA and torch.cuda do.
TEST(VisibleDevices, ReadsCudaVisibleDevicesAsCudaDoes) {
  using accel::rt::cuda::visible_device_count;
  EXPECT_EQ(visible_device_count(nullptr, 4), 4);
  EXPECT_EQ(visible_device_count("", 4), 0);
  EXPECT_EQ(visible_device_count("0", 4), 1);
  EXPECT_EQ(visible_device_count("3,1", 4), 2);
  EXPECT_EQ(visible_device_count(" 2 , 0", 4), 2);
  EXPECT_EQ(visible_device_count("1gpu2,2ampere", 4), 2);  // each entry's leading integer
  EXPECT_EQ(visible_device_count("0,-1,1", 4), 1);         // a negative one ends the list
  EXPECT_EQ(visible_device_count("0,x,1", 4), 1);          // so does one that is not a number
  EXPECT_EQ(visible_device_count("0,1,0", 4), 0);          // a repeat hides every device
  EXPECT_EQ(visible_device_count("0,7,0", 4), 0);          // even after an absent one
  EXPECT_EQ(visible_device_count("1,7,2", 4), 1);          // devices before the first absent one
  EXPECT_EQ(visible_device_count("+1", 4), 1);
  EXPECT_EQ(visible_device_count("-0,1", 4), 2);
  EXPECT_EQ(visible_device_count("GPU-8f3a", 4), -1);  // UUIDs: only NVML can map them
  EXPECT_EQ(visible_device_count("MIG-1234", 4), -1);
}
