// Devices, the current device per thread, properties and typed errors.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <unistd.h>

#include "test_util.h"

namespace accel::rt {
namespace {

TEST(Device, DefaultConfiguration) {
  init();
  EXPECT_TRUE(is_initialized());
  SKIP_UNLESS_HOST_DRIVER();  // the host driver's defaults
  EXPECT_STREQ(driver_name(), "host");
  const DriverCapabilities caps = driver_capabilities();
  EXPECT_TRUE(caps.graphs && caps.host_functions && caps.timing_events &&
              caps.host_accessible_memory && caps.native_handles);
  // The suite runs with ACCEL_HOST_DEVICES and ACCEL_HOST_MEMORY unset: the defaults apply.
  EXPECT_EQ(device_count(), 2);
  EXPECT_EQ(device_count_noexcept(), 2);
  EXPECT_EQ(init_error(), "");
  for (int d = 0; d < device_count(); ++d) {
    const DeviceProperties p = get_device_properties(d);
    EXPECT_EQ(p.name, "accel host device " + std::to_string(d));
    EXPECT_EQ(p.driver, "host");
    EXPECT_EQ(p.total_memory, uint64_t{4} << 30);
    EXPECT_GE(p.compute_units, 1);
    EXPECT_TRUE(p.integrated);
    const MemoryInfo info = mem_get_info(d);
    EXPECT_EQ(info.total, uint64_t{4} << 30);
    EXPECT_LE(info.free, info.total);
    // A UUID of this machine's device d (RFC 9562 version 8, variant 10), the same when asked
    // again, another for the other device.
    EXPECT_EQ(p.uuid, get_device_properties(d).uuid);
    EXPECT_EQ(p.uuid[6] >> 4, 8);
    EXPECT_EQ(p.uuid[8] >> 6, 2);
  }
  EXPECT_NE(get_device_properties(0).uuid, get_device_properties(1).uuid);
  EXPECT_STREQ(version(), "0.1.0");
}

TEST(Device, InvalidIndexIsATypedErrorNamingTheRange) {
  EXPECT_RT_ERROR(set_device(2), InvalidDeviceError, "invalid device index 2");
  EXPECT_RT_ERROR(set_device(2), InvalidDeviceError, "valid indices: 0 to 1");
  EXPECT_RT_ERROR(set_device(-3), InvalidDeviceError, "invalid device index -3");
  EXPECT_RT_ERROR(get_device_properties(7), InvalidDeviceError, "get_device_properties");
  EXPECT_RT_ERROR(stream_create(5), InvalidDeviceError, "stream_create: invalid device index 5");
  EXPECT_RT_ERROR(mem_get_info(64), InvalidDeviceError, "mem_get_info");
  EXPECT_RT_ERROR(event_create(9), InvalidDeviceError, "event_create");
  EXPECT_RT_ERROR(memory_stats(2), InvalidDeviceError, "memory_stats");
  // The failed calls left the current device alone.
  EXPECT_EQ(get_device(), 0);
  try {
    set_device(42);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidDevice);
    EXPECT_NE(std::string(e.file()).find("csrc/runtime/"), std::string::npos);
    EXPECT_GT(e.line(), 0);
    EXPECT_EQ(std::string(e.what()).find(e.message()), 0u);
  }
}

TEST(Device, CurrentDeviceIsPerThread) {
  set_device(1);
  EXPECT_EQ(get_device(), 1);
  int seen_in_thread = -1;
  std::thread([&] { seen_in_thread = get_device(); }).join();
  EXPECT_EQ(seen_in_thread, 0);  // a new thread starts on device 0
  EXPECT_EQ(exchange_device(0), 1);
  EXPECT_EQ(get_device(), 0);
  EXPECT_EQ(exchange_device(0), 0);
}

TEST(Device, FourThreadsSwitchDevicesConcurrently) {
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const int d = (t + i) % 2;
        set_device(d);
        if (get_device() != d) ++mismatches;
        if (current_stream().device() != d) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Device, SynchronizeEveryDevice) {
  std::atomic<int> ran{0};
  for (int d = 0; d < device_count(); ++d) {
    launch_host_func(default_stream(d), [&] { ran.fetch_add(1); });
  }
  device_synchronize(-2);
  EXPECT_EQ(ran.load(), device_count());
}

TEST(Device, SensorsReportWhatTheDeviceHas) {
  // Memory used: at least what the runtime holds there.
  void* p = malloc(std::size_t{64} << 20, default_stream(0));
  if (!testing::sensors_available(0)) {
    free(p);
    GTEST_SKIP() << "the driver reads sensors through NVML, which this machine lacks";
  }
  const int64_t used = device_sensor(Sensor::MemoryUsed, 0);
  EXPECT_GE(used, int64_t{64} << 20);
  const std::vector<DeviceProcess> procs = device_processes(0);
  bool found = false;
  for (const DeviceProcess& proc : procs) {
    if (proc.pid == static_cast<int64_t>(::getpid())) {
      found = true;
      EXPECT_GE(proc.memory, uint64_t{64} << 20);
    }
  }
  // (NVML lists processes by the host's process ids, which a container renumbers: only the
  // host driver's list is checked for this process.)
  if (driver_capabilities().host_accessible_memory) {
    EXPECT_TRUE(found) << "this process is not among the " << procs.size() << " using device 0";
  }
  free(p);
  EXPECT_RT_ERROR(device_sensor(Sensor::Utilization, device_count()), InvalidDeviceError,
                  "device_sensor");
  if (!driver_capabilities().host_accessible_memory) {  // a GPU: NVML's readings
    EXPECT_GT(device_sensor(Sensor::ClockRate, 0), 0);
    EXPECT_GT(device_sensor(Sensor::Temperature, 0), 0);
    return;
  }
  // A host device: memory used is what the driver mapped, total minus free; no sensors of
  // hardware it does not have.
  const MemoryInfo info = mem_get_info(0);
  EXPECT_EQ(device_sensor(Sensor::MemoryUsed, 0), static_cast<int64_t>(info.total - info.free));
  EXPECT_RT_ERROR(device_sensor(Sensor::Temperature, 0), NotSupportedError,
                  "no temperature sensor");
  EXPECT_RT_ERROR(device_sensor(Sensor::PowerDraw, 0), NotSupportedError, "no power draw sensor");
  EXPECT_RT_ERROR(device_sensor(Sensor::MemoryUtilization, 0), NotSupportedError,
                  "no memory utilization");
}

TEST(Device, UtilizationIsTheShareOfTheLastSecondSpentRunningTasks) {
  if (!driver_capabilities().host_accessible_memory) {
    GTEST_SKIP() << "a GPU's utilization counts kernels, not host tasks";
  }
  // 600 ms of one task on device 1 (device 0's other streams may have run work in the last
  // second: only more): at least 600 ms of the 1.0 to 1.1 s sample period.
  Stream s = stream_create(1);
  launch_host_func(s, [] { std::this_thread::sleep_for(std::chrono::milliseconds(600)); });
  stream_synchronize(s);
  const int64_t busy = device_sensor(Sensor::Utilization, 1);
  EXPECT_GE(busy, 54);
  EXPECT_LE(busy, 100);
  // Two streams busy at once count once: 400 ms of overlapping tasks, then a quiet second.
  if (launch_blocking()) {  // tasks run one after the other on this thread
    stream_destroy(s);
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1250));
  EXPECT_EQ(device_sensor(Sensor::Utilization, 1), 0);
  Stream t = stream_create(1);
  for (Stream x : {s, t}) {
    launch_host_func(x, [] { std::this_thread::sleep_for(std::chrono::milliseconds(400)); });
  }
  stream_synchronize(s);
  stream_synchronize(t);
  const int64_t both = device_sensor(Sensor::Utilization, 1);
  EXPECT_GE(both, 36);
  EXPECT_LE(both, 60) << "two overlapping 400 ms tasks counted twice";
  stream_destroy(s);
  stream_destroy(t);
}

TEST(Device, ErrorNamesAndFormatting) {
  EXPECT_STREQ(error_code_name(ErrorCode::OutOfMemory), "out of memory");
  EXPECT_STREQ(error_code_name(ErrorCode::CaptureInvalidated), "capture invalidated");
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1), "1 byte");
  EXPECT_EQ(format_bytes(uint64_t{3} << 29), "1.50 GiB");
  EXPECT_EQ(format_bytes(2048), "2.00 KiB");
  EXPECT_EQ(format_ptr(reinterpret_cast<void*>(0x1000)), "0x1000");
}

}  // namespace
}  // namespace accel::rt
