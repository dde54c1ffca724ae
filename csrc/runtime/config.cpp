// The runtime's configuration from ACCEL_* environment variables.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "runtime/internal.h"

namespace accel::rt::detail {

// --- configuration ------------------------------------------------------------------------

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool parse_bool(const char* variable, bool fallback) {
  const std::string v = lower(env(variable));
  if (v.empty()) return fallback;
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  ACCEL_RT_THROW(InitError, variable, "='", v, "' is not a boolean: use 1 or 0");
}
}  // namespace

uint64_t parse_size(const std::string& text, const char* variable) {
  std::size_t pos = 0;
  unsigned long long value = 0;
  try {
    // stoull accepts a sign and leading spaces ("-1" is 2^64-1): a size starts with a digit.
    if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
      throw std::invalid_argument(text);
    }
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    ACCEL_RT_THROW(InitError, variable, "='", text,
                   "' is not a size: use bytes or a number with K, M, G or T (binary units), "
                   "for example 4G");
  }
  std::string unit = lower(text.substr(pos));
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();  // "gb", "gib"
  if (unit.size() > 1 && unit.back() == 'i') unit.pop_back();  // "gi"
  int shift = 0;
  if (unit.empty()) {
    shift = 0;
  } else if (unit == "k") {
    shift = 10;
  } else if (unit == "m") {
    shift = 20;
  } else if (unit == "g") {
    shift = 30;
  } else if (unit == "t") {
    shift = 40;
  } else {
    ACCEL_RT_THROW(InitError, variable, "='", text, "': unknown unit '", text.substr(pos),
                   "' (use K, M, G or T)");
  }
  ACCEL_RT_CHECK(value <= (~uint64_t{0} >> shift), InitError, variable, "='", text,
                 "' is too large");
  return static_cast<uint64_t>(value) << shift;
}

namespace {
// A whole number from `low` to `high`, or `fallback` when the variable is unset.
int parse_count(const char* variable, int fallback, int low, int high) {
  const std::string text = env(variable);
  if (text.empty()) return fallback;
  std::size_t pos = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  ACCEL_RT_CHECK(pos == text.size() && pos > 0 && n >= low && n <= high, InitError, variable, "='",
                 text, "' must be a whole number from ", low, " to ", high);
  return static_cast<int>(n);
}
}  // namespace

Config Config::from_env() {
  Config c;
  const std::string driver = lower(env("ACCEL_DRIVER"));
  if (!driver.empty()) c.driver = driver;
  const bool name_ok = std::all_of(c.driver.begin(), c.driver.end(),
                                   [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; });
  ACCEL_RT_CHECK(name_ok, InitError, "ACCEL_DRIVER='", c.driver,
                 "' is not a driver name: use auto, host, cuda or level_zero");
  c.driver_path = env("ACCEL_DRIVER_PATH");
  const std::string devices = env("ACCEL_HOST_DEVICES");
  if (!devices.empty()) {
    std::size_t pos = 0;
    int n = 0;
    try {
      n = std::stoi(devices, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    ACCEL_RT_CHECK(pos == devices.size() && pos > 0 && n >= 1 && n <= kMaxDevices, InitError,
                   "ACCEL_HOST_DEVICES='", devices, "' must be a whole number from 1 to ",
                   kMaxDevices);
    c.host_devices = n;
  }
  const std::string memory = env("ACCEL_HOST_MEMORY");
  if (!memory.empty()) {
    c.host_memory = parse_size(memory, "ACCEL_HOST_MEMORY");
    ACCEL_RT_CHECK(c.host_memory >= (uint64_t{1} << 20), InitError, "ACCEL_HOST_MEMORY='", memory,
                   "' is too small: each device needs at least 1M");
  }
  c.launch_blocking = parse_bool("ACCEL_LAUNCH_BLOCKING", false);
  c.protect_device_memory = parse_bool("ACCEL_PROTECT_DEVICE_MEMORY", false);
  c.max_kernel_args = parse_count("ACCEL_MAX_KERNEL_ARGS", c.max_kernel_args, 4, 1 << 16);
  c.max_kernel_buffers = parse_count("ACCEL_MAX_KERNEL_BUFFERS", c.max_kernel_buffers, 2, 1 << 16);
  ACCEL_RT_CHECK(c.max_kernel_buffers <= c.max_kernel_args, InitError,
                 "ACCEL_MAX_KERNEL_BUFFERS=", c.max_kernel_buffers,
                 " is more than ACCEL_MAX_KERNEL_ARGS=", c.max_kernel_args,
                 ": every buffer is an argument");
  return c;
}

}  // namespace accel::rt::detail
