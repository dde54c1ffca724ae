// The host driver's settings from the environment: its own variables, read only when the host
// driver is the one that starts (a bad ACCEL_HOST_MEMORY does not stop the cuda driver).
#include <string>

#include "runtime/driver.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace accel::rt {

HostDriverOptions HostDriverOptions::from_env() {
  HostDriverOptions o;
  o.devices = env::parse_count("ACCEL_HOST_DEVICES", o.devices, 1, kMaxDevices);
  const std::string memory = env::get("ACCEL_HOST_MEMORY");
  if (!memory.empty()) {
    o.memory_per_device = env::parse_size(memory, "ACCEL_HOST_MEMORY");
    ACCEL_RT_CHECK(o.memory_per_device >= (uint64_t{1} << 20), InitError, "ACCEL_HOST_MEMORY='",
                   memory, "' is too small: each device needs at least 1M");
  }
  o.launch_blocking = env::parse_bool("ACCEL_LAUNCH_BLOCKING", false);
  o.protect_device_memory = env::parse_bool("ACCEL_PROTECT_DEVICE_MEMORY", false);
  o.max_kernel_args = env::parse_count("ACCEL_MAX_KERNEL_ARGS", o.max_kernel_args, 4, 1 << 16);
  o.max_kernel_buffers =
      env::parse_count("ACCEL_MAX_KERNEL_BUFFERS", o.max_kernel_buffers, 2, 1 << 16);
  ACCEL_RT_CHECK(o.max_kernel_buffers <= o.max_kernel_args, InitError,
                 "ACCEL_MAX_KERNEL_BUFFERS=", o.max_kernel_buffers,
                 " is more than ACCEL_MAX_KERNEL_ARGS=", o.max_kernel_args,
                 ": every buffer is an argument");
  return o;
}

}  // namespace accel::rt
