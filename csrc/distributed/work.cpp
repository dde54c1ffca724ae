#include "distributed/work.h"

#include <ATen/core/jit_type.h>

#include <algorithm>
#include <atomic>
#include <utility>

namespace accel::distributed {
namespace {

c10::TypePtr tensor_list_type() {
  return c10::ListType::create(c10::TensorType::get());
}

// Rethrows `error` with `context` added to its message, keeping its type (Python sees the same
// exception class: torch.distributed.DistBackendError for timeouts and closed connections).
template <class E>
[[noreturn]] void rethrow_as(const E& e, const std::string& context) {
  E copy = e;
  copy.add_context(context);
  throw copy;
}

}  // namespace

[[noreturn]] void rethrow_naming(std::exception_ptr error, const std::string& name) {
  const std::string context = "accl: while running " + name;
  try {
    std::rethrow_exception(std::move(error));
  } catch (const c10::DistBackendError& e) {
    rethrow_as(e, context);
  } catch (const c10::DistNetworkError& e) {
    rethrow_as(e, context);
  } catch (const c10::ValueError& e) {
    rethrow_as(e, context);
  } catch (const c10::TypeError& e) {
    rethrow_as(e, context);
  } catch (const c10::NotImplementedError& e) {
    rethrow_as(e, context);
  } catch (const c10::Error& e) {
    rethrow_as(e, context);
  } catch (const std::exception& e) {
    // Gloo's transport errors (gloo::IoException: a closed connection, a timeout).
    TORCH_CHECK_WITH(DistBackendError, false, context, " failed: ", e.what());
  }
}

CallState::CallState(std::string name, std::vector<at::Tensor> outputs,
                     std::vector<c10::Device> devices)
    : name(std::move(name)),
      outputs(std::move(outputs)),
      future(c10::make_intrusive<c10::ivalue::Future>(tensor_list_type(), std::move(devices))) {}

HostCallState::HostCallState(std::string name, std::vector<at::Tensor> keep,
                             std::vector<at::Tensor> outputs, std::vector<c10::Device> devices)
    : CallState(std::move(name), std::move(outputs), std::move(devices)), keep_(std::move(keep)) {}

void HostCallState::issued(c10::intrusive_ptr<c10d::Work> inner, std::exception_ptr error,
                           Access access) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    issued_ = true;
    access_ = std::move(access);
    inner_ = inner;
    error_ = error;
  }
  cv_.notify_all();
  if (error) {
    finish(error);
    return;
  }
  c10::intrusive_ptr<c10::ivalue::Future> done;
  try {
    done = inner->getFuture();
  } catch (const c10::Error&) {
    // Gloo's send and recv have no future: wait() completes this one.
  }
  if (done) {
    // The callback holds the state, hence the tensors, until the inner backend is done with them.
    done->addCallback([self = shared_from_this()](c10::ivalue::Future& f) {
      self->finish(f.hasError() ? f.exception_ptr() : nullptr);
    });
  }
}

void HostCallState::finish(std::exception_ptr error) {
  std::vector<at::Tensor> release;
  Access revoke;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    if (error && !error_) error_ = error;
    revoke.swap(access_);  // before the tensors: their memory may be freed with them
    release.swap(keep_);
  }
  revoke.clear();
  if (error) {
    future->setErrorIfNeeded(error);
  } else {
    // No storages, hence no events on the streams of the completing thread: the bytes are in
    // accel memory once the collective finished on the host, so work a waiter enqueues after
    // the future completed already runs after it (host driver). Recording events here would
    // only wake stream workers for nothing.
    future->markCompleted(c10::IValue(outputs),
                          std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>{});
  }
}

void HostCallState::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [this] { return issued_; };
  if (timeout == ::kNoTimeout) {
    cv_.wait(lock, ready);
  } else {
    TORCH_CHECK_WITH(DistBackendError, cv_.wait_for(lock, timeout, ready), "accl: ", name,
                     " did not start within ", timeout.count(),
                     " ms: the work enqueued before it on the stream has not finished");
  }
  auto inner = inner_;
  auto error = error_;
  lock.unlock();
  if (error) rethrow_naming(error, name);
  try {
    inner->wait(timeout);
  } catch (...) {
    auto e = std::current_exception();
    finish(e);
    rethrow_naming(e, name);
  }
  finish(nullptr);
}

bool HostCallState::completed() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!issued_) return false;
  if (finished_ || error_) return true;
  auto inner = inner_;
  lock.unlock();
  return inner->isCompleted();
}

int HostCallState::source_rank() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(inner_, "accl: ", name, " has not started; wait() for it first");
  return inner_->sourceRank();
}

std::exception_ptr HostCallState::error() {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_ || !inner_) return error_;
  return inner_->exception();
}

AccelWork::AccelWork(int rank, c10d::OpType op, std::vector<std::shared_ptr<CallState>> calls)
    : c10d::Work(rank, op), calls_(std::move(calls)) {
  if (calls_.size() == 1) {
    future_ = calls_[0]->future;
    return;
  }
  // Coalesced: one future, completed with every output once all are.
  std::vector<at::Tensor> outputs;
  std::vector<c10::Device> devices;
  for (const auto& c : calls_) {
    outputs.insert(outputs.end(), c->outputs.begin(), c->outputs.end());
    for (const auto& d : c->future->devices()) {
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    }
  }
  future_ = c10::make_intrusive<c10::ivalue::Future>(tensor_list_type(), devices);
  if (calls_.empty()) {
    future_->markCompleted(c10::IValue(outputs));
    return;
  }
  auto left = std::make_shared<std::atomic<size_t>>(calls_.size());
  for (const auto& c : calls_) {
    c->future->addCallback([left, outputs, all = future_](c10::ivalue::Future& f) {
      if (f.hasError()) {
        all->setErrorIfNeeded(f.exception_ptr());
      } else if (left->fetch_sub(1) == 1 && !all->completed()) {
        all->markCompleted(c10::IValue(outputs));
      }
    });
  }
}

bool AccelWork::isCompleted() {
  for (const auto& c : calls_) {
    if (!c->completed()) return false;
  }
  return true;
}

bool AccelWork::isSuccess() const {
  return exception() == nullptr;
}

std::exception_ptr AccelWork::exception() const {
  for (const auto& c : calls_) {
    if (auto e = c->error()) return e;
  }
  return nullptr;
}

std::vector<at::Tensor> AccelWork::result() {
  std::vector<at::Tensor> out;
  for (const auto& c : calls_) out.insert(out.end(), c->outputs.begin(), c->outputs.end());
  return out;
}

int AccelWork::sourceRank() const {
  TORCH_CHECK(calls_.size() == 1, "accl: sourceRank() is defined for a single receive");
  return calls_[0]->source_rank();
}

bool AccelWork::wait(std::chrono::milliseconds timeout) {
  for (const auto& c : calls_) c->wait(timeout);
  return true;
}

}  // namespace accel::distributed
