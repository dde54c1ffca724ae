// A driver library for the plugin-loading tests: the host driver under another name, a driver
// that refuses to start (built with ACCEL_TEST_REFUSE), or one that leaves out capabilities
// (ACCEL_TEST_LIMITED).
#include <cstdio>

#include "runtime/driver.h"

extern "C" __attribute__((visibility("default"))) accel::rt::Driver* accel_driver_create(
    int abi_version, char* error, std::size_t error_len) {
  if (!accel::rt::driver_abi_matches(abi_version, error, error_len)) return nullptr;
#ifdef ACCEL_TEST_REFUSE
  std::snprintf(error, error_len, "no test device is present on this machine");
  return nullptr;
#else
  accel::rt::HostDriverOptions options;
  options.name = "testdrv";
  options.devices = 1;
  options.memory_per_device = 256u << 20;
#ifdef ACCEL_TEST_LIMITED
  // A driver without graphs, timing events and native handles (what the runtime must refuse).
  options.name = "limited";
  options.capabilities.graphs = false;
  options.capabilities.timing_events = false;
  options.capabilities.native_handles = false;
#endif
  return accel::rt::make_host_driver(options).release();
#endif
}

#ifndef ACCEL_TEST_NO_DESTROY  // a library from before ABI 2: the runtime refuses it
extern "C" __attribute__((visibility("default"))) void accel_driver_destroy(
    accel::rt::Driver* driver) {
  delete driver;
}
#endif
