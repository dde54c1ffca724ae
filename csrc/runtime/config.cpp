// The runtime's configuration from ACCEL_* environment variables (each driver reads its own:
// drivers/host/host_options.cpp).
#include <algorithm>
#include <string>

#include "runtime/env.h"
#include "runtime/internal.h"

namespace accel::rt::detail {

Config Config::from_env() {
  Config c;
  const std::string driver = env::lower(env::get("ACCEL_DRIVER"));
  if (!driver.empty()) c.driver = driver;
  const bool name_ok = std::all_of(c.driver.begin(), c.driver.end(),
                                   [](unsigned char ch) { return std::isalnum(ch) || ch == '_'; });
  ACCEL_RT_CHECK(name_ok, InitError, "ACCEL_DRIVER='", c.driver,
                 "' is not a driver name: use auto, host, cuda or level_zero");
  c.driver_path = env::get("ACCEL_DRIVER_PATH");
  c.launch_blocking = env::parse_bool("ACCEL_LAUNCH_BLOCKING", false);
  c.memory_caching = !env::parse_bool("ACCEL_NO_MEMORY_CACHING", false);
  return c;
}

}  // namespace accel::rt::detail
