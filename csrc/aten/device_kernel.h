// Running CPU kernels on accel memory in stream order (drivers whose device memory is host
// memory, i.e. the host driver).
//
// A task captures the raw layout of its tensors (pointer, sizes, strides, dtype, conj/neg bits),
// never the tensors themselves: as with CUDA kernels, the stream-ordered caching allocator keeps
// the memory valid for work already enqueued. Inside the task, CPU tensors are built over the
// same memory and the ATen CPU kernel runs on them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <utility>

#include "device/common.h"

namespace accel::aten {

struct Layout {
  void* data = nullptr;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool conj = false;
  bool neg = false;

  // An undefined tensor has dtype Undefined, and its cpu_view() is undefined too.
  static Layout of(const at::Tensor& t);
  // A CPU tensor over this memory (valid on the host only where device memory is host memory).
  at::Tensor cpu_view() const;
};

// Whether the driver's device memory is host memory (asked once: the driver does not change).
bool host_accessible();

// Throws NotImplementedError naming `what` unless the driver's device memory is host memory.
void require_host_accessible(const char* what);

// Enqueues f() on the current stream of `device`.
template <class F>
void launch(c10::DeviceIndex device, const char* what, F&& f) {
  require_host_accessible(what);
  device::call(
      [&] { rt::launch_host_func(rt::current_stream(device), rt::Task(std::forward<F>(f))); },
      what);
}

}  // namespace accel::aten
