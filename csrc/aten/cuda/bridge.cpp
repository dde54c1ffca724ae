// libaccel_aten_cuda.so: PyTorch's current CUDA device and stream switched to accel's, for ATen
// CUDA kernels launched on accel memory (see bridge.h, csrc/aten/executor.h). Linked against
// torch's c10_cuda; built where the CUDA toolkit and a CUDA build of torch are found.
#include "aten/cuda/bridge.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/MemPool.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>

namespace {

// Runs f(), turning an exception into a nonzero status and its message.
template <class F>
int guarded(char* error, size_t error_len, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return 1;
  }
}

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
    try {
      auto saved = std::make_unique<Saved>(Saved{before, c10::cuda::getCurrentCUDAStream(index)});
      c10::cuda::setCurrentCUDAStream(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(stream), index));
      return saved.release();
    } catch (...) {
      c10::cuda::MaybeExchangeDevice(before);  // leave the thread as it was
      throw;
    }
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
  return guarded(error, error_len, [&] {
    *stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  });
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_wait(int device, void* waiting,
                                                                      void* waited_for, char* error,
                                                                      size_t error_len) {
  if (waiting == waited_for) return 0;
  return guarded(error, error_len, [&] {
    const auto index = static_cast<c10::DeviceIndex>(device);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(waited_for), index).unwrap());
    ready.block(
        c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(waiting), index).unwrap());
  });
}

namespace {

c10::MempoolId_t pool_id(const unsigned long long pool[2]) {
  return {static_cast<c10::CaptureId_t>(pool[0]), static_cast<c10::CaptureId_t>(pool[1])};
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int accel_cuda_pool_begin(
    int device, void* stream, unsigned long long pool[2], char* error, size_t error_len) {
  return guarded(error, error_len, [&] {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long capture = 0;
    C10_CUDA_CHECK(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &capture));
    TORCH_CHECK(status == cudaStreamCaptureStatusActive,
                "accel_cuda_pool_begin: the stream is not capturing");
    // A pool id of PyTorch's own numbering for graph-private pools: no clash with its graphs.
    const c10::MempoolId_t id = at::cuda::MemPool::graph_pool_handle(/*is_user_created=*/false);
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(
        static_cast<c10::DeviceIndex>(device), id, [capture](cudaStream_t s) {
          cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
          unsigned long long id_of_s = 0;
          return cudaStreamGetCaptureInfo(s, &st, &id_of_s) == cudaSuccess &&
                 st == cudaStreamCaptureStatusActive && id_of_s == capture;
        });
    pool[0] = static_cast<unsigned long long>(id.first);
    pool[1] = static_cast<unsigned long long>(id.second);
  });
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_pool_end(
    int device, const unsigned long long pool[2], char* error, size_t error_len) {
  return guarded(error, error_len, [&] {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(static_cast<c10::DeviceIndex>(device),
                                                       pool_id(pool));
  });
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_pool_release(
    int device, const unsigned long long pool[2], char* error, size_t error_len) {
  return guarded(error, error_len, [&] {
    c10::cuda::CUDACachingAllocator::releasePool(static_cast<c10::DeviceIndex>(device),
                                                 pool_id(pool));
  });
}

extern "C" __attribute__((visibility("default"))) int accel_cuda_empty_cache(int device,
                                                                             char* error,
                                                                             size_t error_len) {
  try {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const auto index = static_cast<c10::DeviceIndex>(device);
    const auto reserved = [&] {
      return alloc::getDeviceStats(index)
          .reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
          .current;
    };
    const int64_t before = reserved();
    alloc::emptyCache();
    return reserved() < before ? 1 : 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return -1;
  }
}

namespace {

// A generator state of PyTorch's own kind, in capture mode from the start: PyTorch's kernels
// take their Philox state from it as they do inside torch.cuda.graph (philox_cuda_state: the
// seed and base offset by pointer, the offset within the graph by value). Its seed and offset
// tensors are the caller's pinned memory (CPU tensors: the kernels only take their pointers).
struct GraphRng {
  c10::intrusive_ptr<at::CUDAGeneratorState> state;
  at::Generator generator;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void* accel_cuda_graph_rng_create(
    int device, long long* seed_offset, char* error, size_t error_len) {
  try {
    auto rng = std::make_unique<GraphRng>();
    rng->state = c10::make_intrusive<at::CUDAGeneratorState>();
    const auto options = at::TensorOptions().dtype(at::kLong);
    rng->state->seed_extragraph_ = at::from_blob(seed_offset, {1}, options);
    rng->state->offset_extragraph_ = at::from_blob(seed_offset + 1, {1}, options);
    rng->state->capturing_ = true;
    rng->state->offset_intragraph_ = 0;
    rng->generator = at::make_generator<at::CUDAGeneratorImpl>(
        static_cast<c10::DeviceIndex>(device), rng->state);
    return rng.release();
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

extern "C" __attribute__((visibility("default"))) void* accel_cuda_graph_rng_generator(void* rng) {
  return static_cast<GraphRng*>(rng)->generator.unsafeGetGeneratorImpl();
}

extern "C" __attribute__((visibility("default"))) unsigned long long accel_cuda_graph_rng_increment(
    void* rng) {
  auto* r = static_cast<GraphRng*>(rng);
  std::lock_guard<std::mutex> lock(r->generator.mutex());
  return r->state->offset_intragraph_;
}

extern "C" __attribute__((visibility("default"))) void accel_cuda_graph_rng_destroy(void* rng) {
  delete static_cast<GraphRng*>(rng);
}
