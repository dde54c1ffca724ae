// The host driver's settings from the environment: its own variables, read only when the host
// driver is the one that starts (a bad ACCEL_HOST_MEMORY does not stop the cuda driver); and
// its devices' identity on this machine.
#include <unistd.h>

#include <fstream>
#include <string>

#include "runtime/driver.h"
#include "runtime/drivers/host/host_device.h"
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

namespace host {
namespace {

// What tells this machine apart: systemd's machine id, else the host name.
std::string machine_identity() {
  for (const char* path : {"/etc/machine-id", "/var/lib/dbus/machine-id"}) {
    std::ifstream f(path);
    std::string id;
    if (f && std::getline(f, id) && !id.empty()) return id;
  }
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) return name;
  return "unknown host";
}

// 64-bit FNV-1a of `text` from `seed`, finished by splitmix64's mixer.
uint64_t hash64(std::string_view text, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

std::array<uint8_t, 16> host_device_uuid(std::string_view driver, int device) {
  static const std::string machine = machine_identity();
  const std::string key = machine + '/' + std::string(driver) + '/' + std::to_string(device);
  const uint64_t halves[2] = {hash64(key, 0), hash64(key, 0x9e3779b97f4a7c15ull)};
  std::array<uint8_t, 16> out{};
  for (int i = 0; i < 16; ++i) out[i] = static_cast<uint8_t>(halves[i / 8] >> (8 * (i % 8)));
  out[6] = static_cast<uint8_t>((out[6] & 0x0f) | 0x80);  // version 8
  out[8] = static_cast<uint8_t>((out[8] & 0x3f) | 0x80);  // variant 10
  return out;
}

}  // namespace host
}  // namespace accel::rt
