// What Inductor's C++ wrapper code and AOTInductor models generated for accel include
// (through torch/csrc/inductor/{cpp_wrapper,aoti_include}/accel.h): accel's C shim for extern
// kernels (c_shim_accel.h, generated from torchgen's list: each operator through the dispatcher, so
// it reaches accel's kernels) and the launch of generated kernels on the current accel stream. The
// functions are defined in libtorch_accel, which importing torch_accel loads and makes visible to
// the libraries Inductor compiles.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <initializer_list>
#include <type_traits>
#include <utility>

#include "c_shim_accel.h"

extern "C" {
// Runs run(payload) as a task on the current accel stream of `device` (-1: the current
// device); drop(payload) when the task is done or could not be launched.
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_launch(int32_t device, void (*run)(void*),
                                                         void (*drop)(void*), void* payload,
                                                         const char* name);
// While the current stream of `device` captures a graph: the graph keeps the device memory at
// each of the `n` pointers (a replay after the tensor there was freed must find it mapped).
// Nothing otherwise.
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_capture_keep(int32_t device,
                                                               const void* const* ptrs, int32_t n);
// The current accel device.
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_current_device(int32_t* index);
// An AOTInductor model's constant (a CPU tensor: AOTInductor's model runtime keeps its weights
// on the CPU for devices it does not know) as an accel tensor on the current device, copied
// once per storage.
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_constant(AtenTensorHandle cpu,
                                                           AtenTensorHandle* out);
}

namespace torch_accel_aoti {

// Launches `kernel` (a closure holding the kernel's arguments by value) on the current stream
// of `device`; throws as the C shim's calls do when it cannot be launched.
template <class F>
inline void launch(int32_t device, const char* name, F&& kernel) {
  using K = std::decay_t<F>;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_accel_launch(
      device, [](void* k) { (*static_cast<K*>(k))(); }, [](void* k) { delete static_cast<K*>(k); },
      new K(std::forward<F>(kernel)), name));
}

// The same for a kernel whose buffers are `memory` (their data pointers): a capture keeps them.
template <class F>
inline void launch(int32_t device, const char* name, std::initializer_list<const void*> memory,
                   F&& kernel) {
  AOTI_TORCH_ERROR_CODE_CHECK(
      aoti_torch_accel_capture_keep(device, memory.begin(), static_cast<int32_t>(memory.size())));
  launch(device, name, std::forward<F>(kernel));
}

inline int32_t current_device() {
  int32_t index = 0;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_accel_current_device(&index));
  return index;
}

inline AtenTensorHandle constant(AtenTensorHandle cpu) {
  AtenTensorHandle out = nullptr;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_accel_constant(cpu, &out));
  return out;
}

}  // namespace torch_accel_aoti
