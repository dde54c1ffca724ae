// accel's torch.distributed backend ("accl"): collectives on accel tensors, in stream order.
//
// The inner backend moves the bytes of views of the accel buffers themselves (no copies), on
// the device whose kernels run for accel (aten/executor.h). Ordering follows CUDA's NCCL
// backend: a collective starts once the work already enqueued on the caller's current stream
// has run, and work enqueued after Work::wait() (or on a stream that waited on the Work's
// future) runs after the collective.
//
// - Host driver: Gloo on CPU views. The caller's stream reaching the collective is an event
//   recorded on it, waited for by the backend's communication thread (not a device-wide
//   synchronize). That one thread takes the collectives in call order, so every rank hands them
//   to Gloo in the same order whatever stream each was called from. Work::wait() blocks the
//   calling thread until the collective finished (Gloo's semantics), so errors and timeouts are
//   raised by the call that waits, naming the collective.
// - cuda driver: NCCL on CUDA views, issued with accel's stream as the current CUDA stream;
//   Work::wait() orders the caller's stream after it without blocking (stream_call.h).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace accel::distributed {

class CommThread;

class AccelBackend final : public c10d::Backend {
 public:
  // `inner`: the backend that moves the bytes (Gloo over CPU views of accel memory on the host
  // driver, NCCL over CUDA views on the cuda driver). `checker`: a Gloo backend of the same
  // group through which each collective's signature is compared across ranks first
  // (agreement.h), or null for no check.
  AccelBackend(c10::intrusive_ptr<c10d::Backend> inner, c10::intrusive_ptr<c10d::Backend> checker,
               int rank, int size);
  ~AccelBackend() override;

  const std::string getBackendName() const override { return "accl"; }
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void abort() override;
  void shutdown() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  struct Call;  // one collective on its way through the communication thread

 private:
  c10::intrusive_ptr<c10d::Work> submit(Call call);
  // The cuda driver's path of submit: `name` for messages, `check`: compare signatures first.
  c10::intrusive_ptr<c10d::Work> submit_in_stream_order(Call call, c10::DeviceIndex device,
                                                        const std::string& name, bool check);
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work);

  c10::intrusive_ptr<c10d::Backend> inner_;
  c10::intrusive_ptr<c10d::Backend> checker_;
  bool on_host_;  // the host driver's path (else the cuda driver's)
  std::unique_ptr<CommThread> thread_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
};

}  // namespace accel::distributed
