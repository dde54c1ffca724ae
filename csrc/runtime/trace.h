// Recording when stream tasks actually run, for profilers (torch.profiler through Kineto:
// csrc/profiler). While recording is on, each host task launched on a stream that is not
// capturing is wrapped to note its start and end on the worker that runs it, with the stream,
// the task's label and the tag the launching thread had pushed (torch's correlation id of the
// operator that launched it). Off, launching costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/task.h"
#include "runtime/types.h"

namespace accel::rt::trace {

struct TaskRecord {
  int device = 0;
  uint64_t stream = 0;  // the runtime's stream id (0: the device's default stream)
  std::string label;
  int64_t start_ns = 0;  // system_clock, nanoseconds since the epoch
  int64_t end_ns = 0;
  uint64_t tag = 0;  // 0: launched with no tag pushed
};

bool enabled() noexcept;
// Wraps `task` to record its run (only called while enabled).
Task wrap(Task task, Stream stream, const char* label);

}  // namespace accel::rt::trace
