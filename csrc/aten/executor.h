// Where the underlying tier's kernels run: one executor per driver.
//
// The underlying tier runs the ATen kernel of the device underneath on accel memory, without
// copying (see underlying.h). What is driver-independent (schema facts, result metadata and its
// cache, argument checks and stashing, result allocation) is written once; how a kernel runs
// depends on the driver:
//  - host driver (device memory is host memory): the ATen CPU kernel runs on CPU tensors over the
//    accel memory, as a task on the accel stream (asynchronous to the caller);
//  - cuda driver: the ATen CUDA kernel runs on CUDA tensors over the accel memory, launched by
//    the caller with the accel stream as the current CUDA stream (so it runs in accel stream
//    order and the call returns without synchronizing). The CUDA side lives in
//    libaccel_aten_cuda.so (csrc/aten/cuda), loaded only when the cuda driver runs.
// Without an executor (a driver whose memory the host cannot touch and no bridge for its
// kernels) operators take the CPU fallback, copying through the host.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "aten/host_task.h"
#include "device/graph_rng.h"

namespace accel::aten {

enum class Executor : uint8_t { None, Host, Cuda };

// The executor of the driver this process runs (decided once).
Executor executor();
// Why there is none (empty when there is one).
const std::string& executor_unavailable_reason();

// The device whose kernels run for accel device `index` (-1: the current one): the CPU (host),
// or the CUDA device of the same index (cuda).
c10::Device kernel_device(c10::DeviceIndex index);

// While alive on the calling thread, kernels of the executor's device run for accel device
// `device` in its current stream's order: for cuda, the CUDA device and current CUDA stream are
// accel's (restored afterwards); for the host, nothing.
class KernelScope {
 public:
  explicit KernelScope(c10::DeviceIndex device);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void* state_ = nullptr;
};

// The cuda executor: orders the current stream of accel device `device` with PyTorch's current
// CUDA stream of the same GPU (for copies between accel and CUDA tensors).
void accel_stream_waits_for_torch_cuda(c10::DeviceIndex device);
void torch_cuda_waits_for_accel_stream(c10::DeviceIndex device);

// The cuda executor: a CUDA generator for random operators captured into an accel graph on
// device `device`, reading its Philox seed and base offset from `seed_offset` (pinned memory);
// the factory of device::captured_cuda_generator (device/graph_rng.h).
std::unique_ptr<device::CapturedCudaRng> make_captured_cuda_rng(c10::DeviceIndex device,
                                                                int64_t* seed_offset);

// Runs f(storages) in stream order on the current stream of accel device `device`, with the views
// f makes (Layout::view(storages)) on the executor's device: a task on the stream (host), or at
// once on the caller inside a KernelScope (cuda), where errors raise at the call.
template <class F>
void launch_kernel(c10::DeviceIndex device, const char* what, F&& f) {
  if (executor() == Executor::Cuda) {
    KernelScope scope(device);
    KernelStorages storages(kernel_device(device));
    f(storages);
    return;
  }
  launch(device, what, [f = std::forward<F>(f)]() mutable {
    KernelStorages storages;
    f(storages);
  });
}

}  // namespace accel::aten
