#include "runtime/error.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "runtime/types.h"

namespace accel::rt {

namespace {
// "/abs/path/csrc/runtime/x.cpp" -> "csrc/runtime/x.cpp"
const char* short_path(const char* file) {
  const char* p = std::strstr(file, "csrc/");
  return p != nullptr ? p : file;
}
}  // namespace

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::Success: return "success";
    case ErrorCode::InvalidValue: return "invalid value";
    case ErrorCode::InvalidDevice: return "invalid device";
    case ErrorCode::InvalidHandle: return "invalid handle";
    case ErrorCode::InvalidPointer: return "invalid pointer";
    case ErrorCode::OutOfMemory: return "out of memory";
    case ErrorCode::NotReady: return "not ready";
    case ErrorCode::CaptureUnsupported: return "operation not permitted during capture";
    case ErrorCode::CaptureInvalidated: return "capture invalidated";
    case ErrorCode::CaptureUnjoined: return "capture unjoined";
    case ErrorCode::NotSupported: return "not supported";
    case ErrorCode::InitializationError: return "initialization error";
    case ErrorCode::TaskFailed: return "task failed";
    case ErrorCode::DriverError: return "driver error";
    case ErrorCode::DeviceLost: return "device lost";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, std::string message, const char* file, int line)
    : std::runtime_error(message + " (" + short_path(file) + ":" + std::to_string(line) + ")"),
      code_(code),
      message_(std::move(message)),
      file_(short_path(file)),
      line_(line) {}

const char* memory_type_name(MemoryType type) noexcept {
  switch (type) {
    case MemoryType::Unregistered: return "unregistered";
    case MemoryType::Host: return "host";
    case MemoryType::Device: return "device";
    case MemoryType::Managed: return "managed";
  }
  return "unknown";
}

const char* sensor_name(Sensor sensor) noexcept {
  switch (sensor) {
    case Sensor::Utilization: return "utilization";
    case Sensor::MemoryUtilization: return "memory utilization";
    case Sensor::Temperature: return "temperature";
    case Sensor::PowerDraw: return "power draw";
    case Sensor::ClockRate: return "clock rate";
    case Sensor::MemoryUsed: return "memory used";
  }
  return "unknown sensor";
}

const char* sensor_unit(Sensor sensor) noexcept {
  switch (sensor) {
    case Sensor::Utilization:
    case Sensor::MemoryUtilization: return "%";
    case Sensor::Temperature: return "C";
    case Sensor::PowerDraw: return "mW";
    case Sensor::ClockRate: return "MHz";
    case Sensor::MemoryUsed: return "bytes";
  }
  return "";
}

void throw_error_code(ErrorCode code, std::string message, const char* file, int line) {
  switch (code) {
    case ErrorCode::InvalidValue: throw InvalidValueError(std::move(message), file, line);
    case ErrorCode::InvalidDevice: throw InvalidDeviceError(std::move(message), file, line);
    case ErrorCode::InvalidHandle: throw InvalidHandleError(std::move(message), file, line);
    case ErrorCode::InvalidPointer: throw InvalidPointerError(std::move(message), file, line);
    case ErrorCode::OutOfMemory: throw OutOfMemoryError(std::move(message), file, line);
    case ErrorCode::NotReady: throw NotReadyError(std::move(message), file, line);
    case ErrorCode::CaptureUnsupported:
    case ErrorCode::CaptureInvalidated:
    case ErrorCode::CaptureUnjoined: throw CaptureError(code, std::move(message), file, line);
    case ErrorCode::NotSupported: throw NotSupportedError(std::move(message), file, line);
    case ErrorCode::InitializationError: throw InitError(std::move(message), file, line);
    case ErrorCode::TaskFailed: throw TaskError(std::move(message), file, line);
    case ErrorCode::DeviceLost: throw DeviceLostError(std::move(message), file, line);
    case ErrorCode::Success:
    case ErrorCode::DriverError: break;
  }
  throw DriverError(std::move(message), file, line);
}

std::string format_bytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
  double v = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  return buf;
}

std::string format_ptr(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIxPTR, reinterpret_cast<uintptr_t>(ptr));
  return buf;
}

const char* copy_kind_name(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::HostToHost: return "HostToHost";
    case CopyKind::HostToDevice: return "HostToDevice";
    case CopyKind::DeviceToHost: return "DeviceToHost";
    case CopyKind::DeviceToDevice: return "DeviceToDevice";
    case CopyKind::Default: return "Default";
  }
  return "?";
}

const char* capture_mode_name(CaptureMode mode) noexcept {
  switch (mode) {
    case CaptureMode::Global: return "global";
    case CaptureMode::ThreadLocal: return "thread_local";
    case CaptureMode::Relaxed: return "relaxed";
  }
  return "?";
}

const char* trace_action_name(TraceEntry::Action action) noexcept {
  switch (action) {
    case TraceEntry::Action::Alloc: return "alloc";
    case TraceEntry::Action::FreeRequested: return "free_requested";
    case TraceEntry::Action::FreeCompleted: return "free_completed";
    case TraceEntry::Action::SegmentAlloc: return "segment_alloc";
    case TraceEntry::Action::SegmentFree: return "segment_free";
    case TraceEntry::Action::SegmentMap: return "segment_map";
    case TraceEntry::Action::SegmentUnmap: return "segment_unmap";
    case TraceEntry::Action::Oom: return "oom";
    case TraceEntry::Action::Snapshot: return "snapshot";
  }
  return "?";
}

}  // namespace accel::rt
