// Driver libraries for the plugin tests, each the host driver behind the C table of
// runtime/driver_abi.h:
//  - testdrv (default): the host driver under another name; it also reports a buffer of its own
//    (accel_test_foreign_buffer) as device memory the runtime did not allocate, and adopts
//    streams it made for another "library" (accel_test_foreign_stream), as the cuda driver
//    adopts another library's cudaStream_t.
//  - refuse (ACCEL_TEST_REFUSE): refuses to start.
//  - limited (ACCEL_TEST_LIMITED): no graphs, timing events, native handles or host-accessible
//    memory (so no executor for ATen kernels).
//  - fragile (ACCEL_TEST_FRAGILE): a failed host task loses the device, as a faulting CUDA
//    kernel poisons its context (and so does ACCEL_TEST_LOSE_DEVICE=<file> once it exists).
//  - badtable (ACCEL_TEST_BAD_TABLE): fills a table the runtime must refuse, the fault chosen
//    by ACCEL_TEST_BAD_TABLE=abi|entry|name, or (=short) the shorter table of a library built
//    before the last entry was appended, which the runtime takes.
//  - oldabi (ACCEL_TEST_OLD_ABI): a library from before the C table (exports only
//    accel_driver_create).
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <unistd.h>

#include "runtime/driver_export.h"

namespace {

alignas(64) unsigned char g_foreign[4096];

accel_driver_table g_inner;        // the exported table, for the wrappers below
thread_local std::string t_error;  // a failure of this file's own (fragile, adopt)

[[maybe_unused]] int foreign_pointer_attributes(accel_driver* self, const void* ptr,
                                                accel_drv_pointer_attributes* out) {
  const auto* p = static_cast<const unsigned char*>(ptr);
  if (p >= g_foreign && p < g_foreign + sizeof(g_foreign)) {
    *out = {ACCEL_DRV_MEMORY_DEVICE, 0};
    return ACCEL_DRV_SUCCESS;
  }
  return g_inner.pointer_attributes(self, ptr, out);
}

// fragile: a failed task, or the file named by ACCEL_TEST_LOSE_DEVICE existing (the device
// dies now, for tests without a failing task), loses the device.
[[maybe_unused]] int lose_device_on_failure(int status) {
  const char* trigger = std::getenv("ACCEL_TEST_LOSE_DEVICE");
  if (status == ACCEL_DRV_SUCCESS && trigger != nullptr && ::access(trigger, F_OK) == 0) {
    t_error = std::string("the device fell off the bus (") + trigger + " exists)";
    return ACCEL_DRV_DEVICE_LOST;
  }
  return status == ACCEL_DRV_TASK_FAILED ? ACCEL_DRV_DEVICE_LOST : status;
}

// Streams made for "another library": native handle -> (stream, device).
std::mutex g_foreign_m;
std::map<void*, std::pair<accel_drv_stream, int>> g_foreign_streams;

[[maybe_unused]] int adopt_foreign_stream(accel_driver* self, int device, void* native,
                                          accel_drv_stream* out, int* priority) {
  std::lock_guard<std::mutex> lock(g_foreign_m);
  auto it = g_foreign_streams.find(native);
  if (it == g_foreign_streams.end()) {
    return g_inner.stream_adopt(self, device, native, out, priority);  // the host driver's no
  }
  if (it->second.second != device) {
    t_error = "testdrv: that stream belongs to device " + std::to_string(it->second.second);
    return ACCEL_DRV_INVALID_VALUE;
  }
  *out = it->second.first;
  *priority = 0;
  return ACCEL_DRV_SUCCESS;
}

// The message of a failure this file made (taken, so that it cannot outlive its call), else
// the host driver's.
thread_local std::string t_reported;
[[maybe_unused]] const char* last_error(accel_driver* self) {
  if (t_error.empty()) return g_inner.last_error(self);
  t_reported = std::move(t_error);
  t_error.clear();
  return t_reported.c_str();
}

}  // namespace

extern "C" __attribute__((visibility("default"))) unsigned char* accel_test_foreign_buffer() {
  return g_foreign;
}

// A stream of `device` that the runtime did not create (another library's), by its native
// handle; nullptr if the driver cannot make one.
extern "C" __attribute__((visibility("default"))) void* accel_test_foreign_stream(int device) {
  accel_drv_stream st = nullptr;
  void* native = nullptr;
  if (g_inner.stream_create(g_inner.self, device, 0, &st) != ACCEL_DRV_SUCCESS ||
      g_inner.stream_native_handle(g_inner.self, st, &native) != ACCEL_DRV_SUCCESS) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_foreign_m);
  g_foreign_streams[native] = {st, device};
  return native;
}

#ifndef ACCEL_TEST_OLD_ABI
// The optional count before the runtime starts (driver_abi.h): ACCEL_TEST_DEVICE_COUNT, else
// -1 (cannot count without opening the table).
extern "C" __attribute__((visibility("default"))) int accel_driver_count_devices() {
  const char* n = std::getenv("ACCEL_TEST_DEVICE_COUNT");
  return n != nullptr ? std::atoi(n) : -1;
}
#endif

#ifdef ACCEL_TEST_OLD_ABI
extern "C" __attribute__((visibility("default"))) void* accel_driver_create(int, char*, size_t) {
  return nullptr;
}
#else
extern "C" __attribute__((visibility("default"))) int accel_driver_open(uint32_t abi_version,
                                                                        accel_driver_table* table,
                                                                        size_t table_size,
                                                                        char* error,
                                                                        size_t error_len) {
  if (!accel::rt::driver_abi_matches(abi_version, error, error_len)) return 1;
#ifdef ACCEL_TEST_REFUSE
  std::snprintf(error, error_len, "no test device is present on this machine");
  return 1;
#else
  accel::rt::HostDriverOptions options;
  options.name = "testdrv";  // the host driver's defaults otherwise: the conformance run
#ifdef ACCEL_TEST_LIMITED
  options.name = "limited";
  options.capabilities.host_accessible_memory = false;  // no executor: operators fall back
  options.capabilities.graphs = false;
  options.capabilities.timing_events = false;
  options.capabilities.native_handles = false;
#endif
#ifdef ACCEL_TEST_FRAGILE
  options.name = "fragile";
#endif
  const int status = accel::rt::export_driver(accel::rt::make_host_driver(options), &g_inner,
                                              sizeof(g_inner), error, error_len);
  if (status != 0) return status;
  accel_driver_table t = g_inner;
  t.pointer_attributes = &foreign_pointer_attributes;
  t.stream_adopt = &adopt_foreign_stream;
  t.last_error = &last_error;
#ifdef ACCEL_TEST_FRAGILE
  t.stream_synchronize = [](accel_driver* self, accel_drv_stream s) {
    t_error.clear();
    return lose_device_on_failure(g_inner.stream_synchronize(self, s));
  };
  t.event_synchronize = [](accel_driver* self, accel_drv_event e) {
    t_error.clear();
    return lose_device_on_failure(g_inner.event_synchronize(self, e));
  };
#endif
#ifdef ACCEL_TEST_BAD_TABLE
  const char* fault = std::getenv("ACCEL_TEST_BAD_TABLE");
  if (fault != nullptr && std::strcmp(fault, "abi") == 0) t.abi_version = 2;
  if (fault != nullptr && std::strcmp(fault, "entry") == 0) t.event_query = nullptr;
  if (fault != nullptr && std::strcmp(fault, "name") == 0) t.name = nullptr;
#endif
  t.struct_size = static_cast<uint32_t>(table_size < sizeof(t) ? table_size : sizeof(t));
#ifdef ACCEL_TEST_BAD_TABLE
  // A library built before oom_hint was appended: its table ends before it.
  if (fault != nullptr && std::strcmp(fault, "short") == 0) {
    t.struct_size = static_cast<uint32_t>(offsetof(accel_driver_table, oom_hint));
  }
#endif
  std::memcpy(static_cast<void*>(table), &t, t.struct_size);
  return 0;
#endif
}
#endif
