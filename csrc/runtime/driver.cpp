// The Driver interface's defaults: what a driver that leaves a call out does.
#include "runtime/driver.h"

#include "runtime/error.h"

namespace accel::rt {

Driver::~Driver() = default;

void Driver::host_access_begin(int, const void*, std::size_t) {}
void Driver::host_access_end(int, const void*, std::size_t) {}

void Driver::graph_debug_dump(DriverGraph, const char*) {
  ACCEL_RT_THROW(NotSupportedError, "graph_debug_dump: the ", name(),
                 " driver cannot write graph debug dumps");
}

DriverStream Driver::stream_adopt(int, void*, int*) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                 " driver cannot adopt a stream it did not create");
}

int64_t Driver::device_sensor(int, Sensor sensor) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(), " driver does not report ",
                 sensor_name(sensor));
}

std::vector<DeviceProcess> Driver::device_processes(int) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                 " driver does not list the processes using its devices");
}

}  // namespace accel::rt
