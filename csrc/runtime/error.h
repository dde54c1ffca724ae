// Typed errors of the accel runtime.
//
// Every runtime call reports failure by throwing an accel::rt::Error (or one of its subclasses)
// whose message names the call, its arguments and what to do. Nothing in the runtime aborts on
// bad input. ACCEL_RT_CHECK is the one checking macro: it records the caller's file and line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#define ACCEL_RT_API __attribute__((visibility("default")))

namespace accel::rt {

enum class ErrorCode : int {
  Success = 0,
  InvalidValue,         // an argument is out of range or inconsistent
  InvalidDevice,        // device index out of range
  InvalidHandle,        // stream, event or graph that was destroyed or never existed
  InvalidPointer,       // pointer unknown to the runtime, or already freed
  OutOfMemory,          // device (or pinned host) memory exhausted
  NotReady,             // the work an answer depends on has not completed
  CaptureUnsupported,   // the call is not allowed while a stream is capturing
  CaptureInvalidated,   // the capture was invalidated by an earlier illegal call
  CaptureUnjoined,      // a stream that joined the capture was not joined back
  NotSupported,         // the driver or build does not provide the feature
  InitializationError,  // the runtime or its driver could not start
  TaskFailed,           // work executed on a stream raised an error
  DriverError,          // the driver reported an unexpected failure
  DeviceLost,           // the device's context is unusable for the rest of the process (sticky)
};

ACCEL_RT_API const char* error_code_name(ErrorCode code) noexcept;

class ACCEL_RT_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, const char* file, int line);
  ErrorCode code() const noexcept { return code_; }
  // The message without the source location.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorCode code_;
  std::string message_;
  const char* file_;
  int line_;
};

// One subclass per family so callers can catch by type.
#define ACCEL_RT_DECLARE_ERROR(Name, Code)                                \
  class ACCEL_RT_API Name : public Error {                                \
   public:                                                                \
    Name(std::string message, const char* file, int line)                 \
        : Error(ErrorCode::Code, std::move(message), file, line) {}       \
    Name(ErrorCode code, std::string message, const char* file, int line) \
        : Error(code, std::move(message), file, line) {}                  \
  }
ACCEL_RT_DECLARE_ERROR(InvalidValueError, InvalidValue);
ACCEL_RT_DECLARE_ERROR(InvalidDeviceError, InvalidDevice);
ACCEL_RT_DECLARE_ERROR(InvalidHandleError, InvalidHandle);
ACCEL_RT_DECLARE_ERROR(InvalidPointerError, InvalidPointer);
ACCEL_RT_DECLARE_ERROR(OutOfMemoryError, OutOfMemory);
ACCEL_RT_DECLARE_ERROR(NotReadyError, NotReady);
ACCEL_RT_DECLARE_ERROR(CaptureError, CaptureUnsupported);  // also CaptureInvalidated/Unjoined
ACCEL_RT_DECLARE_ERROR(NotSupportedError, NotSupported);
ACCEL_RT_DECLARE_ERROR(InitError, InitializationError);
ACCEL_RT_DECLARE_ERROR(TaskError, TaskFailed);
ACCEL_RT_DECLARE_ERROR(DriverError, DriverError);
ACCEL_RT_DECLARE_ERROR(DeviceLostError, DeviceLost);
#undef ACCEL_RT_DECLARE_ERROR

// Throws the subclass of Error that `code` belongs to (DriverError for Success or an unknown code).
[[noreturn]] ACCEL_RT_API void throw_error_code(ErrorCode code, std::string message,
                                                const char* file, int line);

// "1.50 GiB", "512 bytes": sizes in messages.
ACCEL_RT_API std::string format_bytes(uint64_t bytes);
// "0x7f12..."
ACCEL_RT_API std::string format_ptr(const void* ptr);

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class E, class... Args>
[[noreturn]] void throw_error(const char* file, int line, const Args&... args) {
  throw E(concat(args...), file, line);
}
}  // namespace detail
}  // namespace accel::rt

// ACCEL_RT_CHECK(cond, ErrorType, message parts...): throws ErrorType with the message and the
// caller's file and line when cond is false.
#define ACCEL_RT_CHECK(cond, ErrorType, ...)                                                     \
  do {                                                                                           \
    if (__builtin_expect(!(cond), 0)) {                                                          \
      ::accel::rt::detail::throw_error<::accel::rt::ErrorType>(__FILE__, __LINE__, __VA_ARGS__); \
    }                                                                                            \
  } while (0)

#define ACCEL_RT_THROW(ErrorType, ...) \
  ::accel::rt::detail::throw_error<::accel::rt::ErrorType>(__FILE__, __LINE__, __VA_ARGS__)
