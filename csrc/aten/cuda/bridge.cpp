// libaccel_aten_cuda.so: PyTorch's current CUDA device and stream switched to accel's, for ATen
// CUDA kernels launched on accel memory (see bridge.h, csrc/aten/executor.h). Linked against
// torch's c10_cuda; built where the CUDA toolkit and a CUDA build of torch are found.
#include "aten/cuda/bridge.h"

#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <exception>

namespace {

struct Saved {
  c10::DeviceIndex device;       // the thread's CUDA device before
  c10::cuda::CUDAStream stream;  // the accel device's current CUDA stream before
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int accel_cuda_bridge_version() {
  return ACCEL_CUDA_BRIDGE_VERSION;
}

extern "C" __attribute__((visibility("default"))) void* accel_cuda_enter(int device, void* stream,
                                                                         char* error,
                                                                         size_t error_len) {
  try {
    const auto index = static_cast<c10::DeviceIndex>(device);
    const c10::DeviceIndex before = c10::cuda::ExchangeDevice(index);
    auto* saved = new Saved{before, c10::cuda::getCurrentCUDAStream(index)};
    c10::cuda::setCurrentCUDAStream(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), index));
    return saved;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

extern "C" __attribute__((visibility("default"))) void accel_cuda_exit(void* state) {
  auto* saved = static_cast<Saved*>(state);
  try {
    c10::cuda::setCurrentCUDAStream(saved->stream);
    c10::cuda::MaybeExchangeDevice(saved->device);
  } catch (...) {
    // Restoring cannot fail for a device and stream that were current a moment ago.
  }
  delete saved;
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_current_stream(int device,
                                                                                void** stream,
                                                                                char* error,
                                                                                size_t error_len) {
  try {
    *stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return 1;
  }
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_wait(int device, void* waiting,
                                                                      void* waited_for, char* error,
                                                                      size_t error_len) {
  if (waiting == waited_for) return 0;
  try {
    const auto index = static_cast<c10::DeviceIndex>(device);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(waited_for), index).unwrap());
    ready.block(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(waiting), index).unwrap());
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return 1;
  }
}
