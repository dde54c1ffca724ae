// For driver libraries written in C++: the C table of runtime/driver_abi.h from an
// accel::rt::Driver.
//
// A library implements Driver, then exports the table:
//
//   extern "C" __attribute__((visibility("default"))) int accel_driver_open(
//       uint32_t abi_version, accel_driver_table* table, size_t table_size, char* error,
//       size_t error_len) {
//     if (!accel::rt::driver_abi_matches(abi_version, error, error_len)) return 1;
//     return accel::rt::export_driver(std::make_unique<MyDriver>(), table, table_size, error,
//                                     error_len);
//   }
//
// Every entry calls the driver and turns what it throws into a status and the thread's last
// error message; host functions arrive as Tasks that own the payload (released when the Task
// is destroyed) and throw TaskError with the message the function wrote when it fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/driver.h"
#include "runtime/driver_abi.h"

namespace accel::rt {

// Whether the runtime's ABI is the one the library was built for; writes the refusal into
// `error` otherwise.
ACCEL_RT_API bool driver_abi_matches(uint32_t abi_version, char* error, std::size_t error_len);

// Fills `table` (at most table_size bytes) for `driver`, which the table's destroy deletes.
// Returns 0, or nonzero after writing why into `error`.
ACCEL_RT_API int export_driver(std::unique_ptr<Driver> driver, accel_driver_table* table,
                               std::size_t table_size, char* error, std::size_t error_len);

}  // namespace accel::rt
