#include "runtime/drivers/host/host_stream.h"

#include "runtime/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <exception>

namespace accel::rt {

void give_back_openmp_team() noexcept {
  using Pause = int (*)(int, int);
  static const Pause pause = []() -> Pause {
    if (::dlsym(RTLD_DEFAULT, "__kmpc_fork_call") != nullptr) return nullptr;
    return reinterpret_cast<Pause>(::dlsym(RTLD_DEFAULT, "omp_pause_resource"));
  }();
  static const int host = [] {
    auto initial = reinterpret_cast<int (*)()>(::dlsym(RTLD_DEFAULT, "omp_get_initial_device"));
    return initial != nullptr ? initial() : 0;
  }();
  constexpr int kSoft = 1;  // omp_pause_soft
  if (pause != nullptr) (void)pause(kSoft, host);
}

}  // namespace accel::rt

namespace accel::rt::host {

thread_local HostStream* tls_worker_stream = nullptr;

uint32_t Capture::add_node(Task task, std::vector<uint32_t> deps, const char* label) {
  std::lock_guard<std::mutex> lock(m);
  ACCEL_RT_CHECK(!ended, CaptureError, "host driver: the capture already ended");
  nodes.push_back(Node{std::move(task), std::move(deps), label != nullptr ? label : "host task"});
  return static_cast<uint32_t>(nodes.size() - 1);
}

void HostEvent::complete(uint64_t version) {
  if (shared) return shared->complete(version);
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(m);
    if (version > done) {
      done = version;
      stamp = now;
    }
  }
  cv.notify_all();
}

void HostEvent::wait_for(uint64_t version) {
  if (shared) return shared->wait_for(version);
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done >= version; });
}

void HostStream::shutdown() {
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv_work.notify_all();
  if (worker.joinable()) worker.join();
}

bool HostStream::record_if_capturing(Task& task, const char* label) {
  if (!capture) return false;
  const uint32_t id = capture->add_node(std::move(task), frontier, label);
  frontier.assign(1, id);
  return true;
}

void HostStream::submit(Task task, const char* label) {
  std::unique_lock<std::mutex> lock(m);
  enqueue_locked(std::move(task), label, lock);
}

void HostStream::enqueue_locked(Task task, const char* label, std::unique_lock<std::mutex>& lock) {
  if (record_if_capturing(task, label)) return;
  if (blocking) {
    lock.unlock();
    run_inline(task);
    return;
  }
  queue.push_back(std::move(task));
  submitted.fetch_add(1, std::memory_order_seq_cst);
  if (!worker.joinable()) {
    worker = std::thread([this] { work(); });
  }
  const bool wake = sleeping;
  lock.unlock();
  if (wake) cv_work.notify_one();
}

bool HostEvent::stream_passed() const {
  const std::shared_ptr<HostStream> s = record_stream.lock();
  return s == nullptr || s->completed.load(std::memory_order_seq_cst) >= record_task;
}

void HostStream::run_inline(Task& task) {
  std::lock_guard<std::recursive_mutex> lock(inline_mutex);
  submitted.fetch_add(1, std::memory_order_seq_cst);
  if (busy != nullptr) busy->begin();
  struct Done {
    HostStream* s;
    ~Done() {
      if (s->busy != nullptr) s->busy->end();
      s->mark_completed();
    }
  } done{this};
  task();  // launch blocking: a failure surfaces at the call that submitted the work
}

void HostStream::mark_completed() {
  completed.fetch_add(1, std::memory_order_seq_cst);
  if (waiters.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(m);
    cv_done.notify_all();
  }
}

void HostStream::work() {
  tls_worker_stream = this;
  apply_priority();
  std::vector<Task> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(m);
      while (queue.empty() && !stop) {
        lock.unlock();
        spin_until(
            [&] {
              return submitted.load(std::memory_order_relaxed) !=
                     completed.load(std::memory_order_relaxed);
            },
            kWorkerSpin);
        lock.lock();
        if (!queue.empty() || stop) break;
        sleeping = true;
        if (!cv_work.wait_for(lock, kWorkerKeepsTeam, [&] { return !queue.empty() || stop; })) {
          lock.unlock();
          give_back_openmp_team();  // runtime.h
          lock.lock();
          cv_work.wait(lock, [&] { return !queue.empty() || stop; });
        }
        sleeping = false;
      }
      if (queue.empty() && stop) return;
      batch.swap(queue);
    }
    // With protected memory, every task unprotects all device memory while it runs; a batch
    // holds that access throughout, so tasks inside it pay no mprotect of their own. It ends
    // before the last task counts as completed: a synchronize that returns finds the memory
    // protected again.
    const bool lease = protects_memory(driver) && access(true);
    if (busy != nullptr) busy->begin();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      try {
        batch[i]();
      } catch (const std::exception& e) {
        record_error(e.what());
      } catch (...) {
        record_error("unknown exception");
      }
      batch[i].reset();
      if (i + 1 == batch.size()) {
        if (lease) access(false);
        if (busy != nullptr) busy->end();
      }
      mark_completed();
    }
    batch.clear();
  }
}

// Begins or ends the batch's access to all device memory; false if that failed (each task
// then still gets its own access).
bool HostStream::access(bool begin) {
  try {
    access_all_memory(driver, begin);
    return true;
  } catch (const std::exception& e) {
    record_error(e.what());
    return false;
  }
}

void HostStream::apply_priority() {
  // Best effort: higher-priority streams get a lower nice value where permitted.
  if (priority < 0) {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), priority * 5);
  }
  // Linux limits thread names to 15 characters.
  std::string name = "accel-d" + std::to_string(device) + "-p" + std::to_string(-priority);
  name.resize(std::min<std::size_t>(name.size(), 15));
  ::pthread_setname_np(::pthread_self(), name.c_str());
}

void HostStream::record_error(const char* what) {
  std::lock_guard<std::mutex> lock(m);
  if (error.empty()) error = what;
}

std::string HostStream::take_error() {
  std::lock_guard<std::mutex> lock(m);
  std::string e;
  e.swap(error);
  return e;
}

void HostStream::synchronize() {
  ACCEL_RT_CHECK(tls_worker_stream != this, InvalidValueError,
                 "stream_synchronize was called from a task running on the same stream; "
                 "it would wait for itself forever");
  const uint64_t target = submitted.load(std::memory_order_seq_cst);
  const auto reached = [&] { return completed.load(std::memory_order_seq_cst) >= target; };
  if (!spin_until(reached, kSyncSpin)) {
    std::unique_lock<std::mutex> lock(m);
    waiters.fetch_add(1, std::memory_order_seq_cst);
    cv_done.wait(lock, reached);
    waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
  throw_if_failed();
}

void HostStream::throw_if_failed() {
  std::string e = take_error();
  if (!e.empty()) {
    ACCEL_RT_THROW(TaskError, "a task on a stream of device ", device, " failed: ", e);
  }
}

}  // namespace accel::rt::host
