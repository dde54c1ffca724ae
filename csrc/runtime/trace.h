// Recording when stream tasks actually run, for profilers (torch.profiler through Kineto:
// csrc/profiler). While recording is on, each host task launched on a stream that is not
// capturing is wrapped to note its start and end on the worker that runs it, with the stream,
// the task's label and the tag the launching thread had pushed (torch's correlation id of the
// operator that launched it). Copies and fills, which drivers run as work of their own, are
// bracketed by two marker tasks (open/close). Off, launching costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/task.h"
#include "runtime/types.h"

namespace accel::rt::trace {

enum class Kind : uint8_t { Task, Memcpy, Memset };

struct TaskRecord {
  Kind kind = Kind::Task;
  int device = 0;
  uint64_t stream = 0;  // the runtime's stream id (0: the device's default stream)
  std::string label;
  int64_t start_ns = 0;  // system_clock, nanoseconds since the epoch
  int64_t end_ns = 0;
  uint64_t tag = 0;  // 0: launched with no tag pushed
};

bool enabled() noexcept;
int64_t now_ns();
// Wraps `task` to record its run (only called while enabled).
Task wrap(Task task, Stream stream, const char* label);
// A record of driver work about to be enqueued on `stream` (tagged now); a marker task before
// the work sets its start_ns, close() called by a marker task after it ends and keeps it.
std::shared_ptr<TaskRecord> open(Stream stream, const char* label, Kind kind);
void close(TaskRecord& record);

}  // namespace accel::rt::trace
