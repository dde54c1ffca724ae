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

std::size_t Driver::va_granularity(int) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(), " driver has no virtual memory");
}
// Without virtual memory every va_* call refuses as va_granularity does.
void* Driver::va_reserve(int device, std::size_t) {
  va_granularity(device);
  return nullptr;
}
void Driver::va_release(int device, void*, std::size_t) {
  va_granularity(device);
}
bool Driver::va_map(int device, void*, std::size_t) {
  va_granularity(device);
  return false;
}
void Driver::va_unmap(int device, void*, std::size_t) {
  va_granularity(device);
}

IpcMemHandle Driver::ipc_get_mem_handle(int, void*, std::size_t) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                 " driver cannot share device memory with other processes");
}
// Without interprocess memory every ipc_* call refuses as ipc_get_mem_handle does.
void* Driver::ipc_open_mem_handle(int device, const IpcMemHandle&, std::size_t*) {
  ipc_get_mem_handle(device, nullptr, 0);
  return nullptr;
}
void Driver::ipc_close_mem_handle(int device, void*) {
  ipc_get_mem_handle(device, nullptr, 0);
}

DriverEvent Driver::event_create_ipc(int) {
  ACCEL_RT_THROW(NotSupportedError, "the ", name(),
                 " driver has no events that other processes can wait on");
}
IpcEventHandle Driver::ipc_get_event_handle(DriverEvent) {
  event_create_ipc(0);
  return {};
}
DriverEvent Driver::ipc_open_event_handle(int device, const IpcEventHandle&) {
  return event_create_ipc(device);
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
