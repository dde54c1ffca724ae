// The Work of accel's torch.distributed backend: one collective, or several coalesced.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "runtime/runtime.h"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace accel::distributed {

// One collective as its Work sees it, however it runs (host_call below, stream_call.h).
struct CallState {
  CallState(std::string name, std::vector<at::Tensor> outputs, std::vector<c10::Device> devices);
  virtual ~CallState() = default;

  // Blocks until the collective completed (host) or orders the caller's current stream after
  // it (stream); rethrows its error, naming it.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  virtual bool completed() = 0;
  virtual int source_rank() = 0;  // recv from any source: the sender, once waited for
  virtual std::exception_ptr error() = 0;

  const std::string name;  // "allreduce on accel:0", for messages
  const std::vector<at::Tensor> outputs;
  const c10::intrusive_ptr<c10::ivalue::Future> future;
};

// Rethrows `error` keeping its type, with "accl: while running <name>" added to its message;
// other exceptions (Gloo's transport errors) become DistBackendError.
[[noreturn]] void rethrow_naming(std::exception_ptr error, const std::string& name);

// A collective that runs on the host (host driver): the communication thread hands it to the
// inner backend once the caller's stream reached it, and it is done once the inner backend is.
struct HostCallState final : CallState, std::enable_shared_from_this<HostCallState> {
  HostCallState(std::string name, std::vector<at::Tensor> keep, std::vector<at::Tensor> outputs,
                std::vector<c10::Device> devices);

  using Access = std::vector<std::unique_ptr<rt::HostAccessGuard>>;

  // The communication thread, once it gave the collective to the inner backend (or failed to);
  // `access` keeps the accel memory host-accessible (ACCEL_PROTECT_DEVICE_MEMORY) until done.
  void issued(c10::intrusive_ptr<c10d::Work> inner, std::exception_ptr error, Access access);
  // Completes the future (idempotent): with the outputs, or with `error`.
  void finish(std::exception_ptr error);
  void wait(std::chrono::milliseconds timeout) override;
  bool completed() override;
  int source_rank() override;
  std::exception_ptr error() override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool issued_ = false;
  bool finished_ = false;
  c10::intrusive_ptr<c10d::Work> inner_;
  std::exception_ptr error_;
  std::vector<at::Tensor> keep_;  // the accel tensors the collective reads or writes
  Access access_;
};

class AccelWork final : public c10d::Work {
 public:
  AccelWork(int rank, c10d::OpType op, std::vector<std::shared_ptr<CallState>> calls);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  int sourceRank() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  const std::vector<std::shared_ptr<CallState>>& calls() const { return calls_; }

 private:
  std::vector<std::shared_ptr<CallState>> calls_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace accel::distributed
