#include "distributed/stream_call.h"

#include <ATen/ops/record_stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>

#include "aten/executor.h"
#include "device/common.h"

namespace accel::distributed {

StreamCallState::StreamCallState(std::string name, std::vector<at::Tensor> keep,
                                 std::vector<at::Tensor> outputs, c10::DeviceIndex device)
    : CallState(std::move(name), std::move(outputs), {c10::Device(device::kAccel, device)}),
      device_(device),
      keep_(std::move(keep)) {}

void StreamCallState::issued(c10::intrusive_ptr<c10d::Work> inner) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inner_ = inner;
  }
  c10::intrusive_ptr<c10::ivalue::Future> done;
  try {
    done = inner->getFuture();
  } catch (const c10::Error&) {
    return;  // no future: wait() completes this one
  }
  // NCCL's future completes when the collective is enqueued, with CUDA events at its end: the
  // callback runs with PyTorch's current CUDA stream waiting for them (Future::invokeCallback).
  done->addCallback([self = shared_from_this()](c10::ivalue::Future& f) {
    if (f.hasError()) {
      self->future->setErrorIfNeeded(f.exception_ptr());
      std::lock_guard<std::mutex> lock(self->mu_);
      self->keep_.clear();
      return;
    }
    try {
      self->complete(true);
    } catch (...) {
      self->future->setErrorIfNeeded(std::current_exception());
    }
  });
}

void StreamCallState::complete(bool cuda_ordered) {
  std::vector<at::Tensor> release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return;
    completing_ = true;
    release.swap(keep_);
  }
  const c10::Device accel(device::kAccel, device_);
  const c10::Stream side =
      c10::impl::getDeviceGuardImpl(device::kAccel)->getStreamFromGlobalPool(accel, false);
  c10::StreamGuard guard(
      cuda_ordered ? side : c10::impl::getDeviceGuardImpl(device::kAccel)->getStream(accel));
  // The stream the future's events go on waits for the collective; the memory it used is
  // reused only after that point.
  if (cuda_ordered) aten::accel_stream_waits_for_torch_cuda(device_);
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(device::kAccel)->getStream(accel);
  for (auto& t : release) t.record_stream(stream);
  future->markCompleted(c10::IValue(outputs));
}

void StreamCallState::wait(std::chrono::milliseconds timeout) {
  c10::intrusive_ptr<c10d::Work> inner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inner = inner_;
  }
  TORCH_CHECK(inner, "accl: ", name, " was not issued");
  try {
    // NCCL's wait orders PyTorch's current CUDA stream, which is accel's inside the scope.
    aten::KernelScope scope(device_);
    inner->wait(timeout);
  } catch (...) {
    auto e = std::current_exception();
    future->setErrorIfNeeded(e);
    rethrow_naming(e, name);
  }
  if (future->hasError()) rethrow_naming(future->exception_ptr(), name);
  complete(false);
}

bool StreamCallState::completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return inner_ && inner_->isCompleted();
}

int StreamCallState::source_rank() {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(inner_, "accl: ", name, " was not issued");
  return inner_->sourceRank();
}

std::exception_ptr StreamCallState::error() {
  if (future->hasError()) return future->exception_ptr();
  std::lock_guard<std::mutex> lock(mu_);
  return inner_ ? inner_->exception() : nullptr;
}

}  // namespace accel::distributed
