#include "runtime/trace.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>

#include "runtime/runtime.h"

namespace accel::rt {
namespace trace {
namespace {

std::atomic<bool> g_enabled{false};
// Bumped by each start: tags pushed during an earlier recording (left unbalanced when it was torn
// down mid-operator) are ignored afterwards.
std::atomic<uint64_t> g_generation{0};
std::mutex g_mutex;
std::vector<TaskRecord>* g_records = new std::vector<TaskRecord>();  // leaked: outlives workers

struct Tag {
  uint64_t generation;
  uint64_t value;
};
thread_local std::vector<Tag> t_tags;

uint64_t current_tag() {
  const uint64_t gen = g_generation.load(std::memory_order_relaxed);
  while (!t_tags.empty() && t_tags.back().generation != gen) t_tags.pop_back();
  return t_tags.empty() ? 0 : t_tags.back().value;
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::shared_ptr<TaskRecord> open(Stream stream, const char* label, Kind kind) {
  auto r = std::make_shared<TaskRecord>();
  r->kind = kind;
  r->device = stream.device();
  r->stream = stream.id();
  r->label = label;
  r->tag = current_tag();
  return r;
}

void close(TaskRecord& record) {
  record.end_ns = now_ns();
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records->push_back(record);
}

bool enabled() noexcept {
  return g_enabled.load(std::memory_order_relaxed);
}

Task wrap(Task task, Stream stream, const char* label) {
  auto inner = std::make_shared<Task>(std::move(task));
  // open() copies the label: callers may pass a name that does not outlive the launch.
  return Task([inner, record = open(stream, label != nullptr ? label : "task", Kind::Task)] {
    record->start_ns = now_ns();
    struct Close {  // also when the task throws
      TaskRecord& r;
      ~Close() { close(r); }
    } close_when_done{*record};
    (*inner)();
  });
}

}  // namespace trace

void trace_start() {
  std::lock_guard<std::mutex> lock(trace::g_mutex);
  trace::g_records->clear();
  trace::g_generation.fetch_add(1, std::memory_order_relaxed);
  trace::g_enabled.store(true, std::memory_order_seq_cst);
}

std::vector<trace::TaskRecord> trace_stop() {
  trace::g_enabled.store(false, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> lock(trace::g_mutex);
  std::vector<trace::TaskRecord> out;
  out.swap(*trace::g_records);
  return out;
}

void trace_push_tag(uint64_t tag) {
  trace::t_tags.push_back({trace::g_generation.load(std::memory_order_relaxed), tag});
}

void trace_pop_tag() {
  if (!trace::t_tags.empty()) trace::t_tags.pop_back();
}

}  // namespace accel::rt
