// A collective that runs on the device's own streams: the cuda driver, where NCCL moves the bytes
// of CUDA views of the accel memory, as torch.cuda's NCCL backend does for CUDA tensors.
//
// The collective is issued from the caller's thread with accel's current stream as the current
// CUDA stream (aten::KernelScope), so NCCL's stream waits for the work already enqueued there.
// Work::wait() makes the caller's current accel stream wait for the collective (an event, not a
// host synchronize), as torch.cuda's Work::wait() does. The future completes with events on an
// accel stream that waits for the collective, so whatever consumes it (DDP's comm hooks, then())
// runs after it. The accel tensors are marked as used by that stream (record_stream): memory
// freed before the collective finished is reused only after it.
#pragma once

#include "distributed/work.h"

namespace accel::distributed {

struct StreamCallState final : CallState, std::enable_shared_from_this<StreamCallState> {
  StreamCallState(std::string name, std::vector<at::Tensor> keep, std::vector<at::Tensor> outputs,
                  c10::DeviceIndex device);

  // The inner backend took the collective (called right after, on the caller's thread).
  void issued(c10::intrusive_ptr<c10d::Work> inner);
  void wait(std::chrono::milliseconds timeout) override;
  bool completed() override;
  int source_rank() override;
  std::exception_ptr error() override;

 private:
  // Completes the future in stream order: called with PyTorch's current CUDA stream ordered
  // after the collective (the inner future's callback), or after wait() ordered accel's.
  void complete(bool cuda_ordered);

  const c10::DeviceIndex device_;
  std::mutex mu_;
  bool completing_ = false;
  std::vector<at::Tensor> keep_;
  c10::intrusive_ptr<c10d::Work> inner_;
};

}  // namespace accel::distributed
