// Helpers shared by the boxed kernels (the CPU fallback and the underlying tier).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <string>
#include <string_view>

#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "device/common.h"
#include "device/generator.h"

namespace accel::aten {

// "aten::add.Tensor"
std::string op_name(const c10::OperatorHandle& op);

// An optional tensor argument of a boxed call: undefined for None. By reference, so that a
// borrowed argument (a typed entry's: typed_kernel.h) is not copied.
inline const at::Tensor& optional_tensor(const c10::IValue& v) {
  static const at::Tensor none;
  return v.isNone() ? none : v.toTensor();
}

// A defined tensor on an accel device.
inline bool is_accel(const at::Tensor& t) {
  return t.defined() && t.device().type() == device::kAccel;
}

// The accel device a call runs on: that of its accel tensor and device arguments (the current
// device if none). Refuses, like CUDA, arguments on two accel devices, an accel generator
// without accel tensors, and CPU tensors next to accel tensors other than 0-dim scalars,
// indices (Tensor?[] of index/index_put) and the scalars tensors of _foreach_ operators.
c10::DeviceIndex call_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                             std::string_view name);

// Whether the tensor lists of a _foreach_ call hold tensors of several devices (0-dim CPU
// tensors read as scalars, and the `scalars` tensor, aside): CUDA's kernels then run the call
// tensor by tensor (their slow path, which is the CPU's kernel), each tensor's operator on
// that tensor's device.
bool foreach_lists_span_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// Whether an argument of a schema is a Generator or Generator?.
bool is_generator_argument(const c10::Argument& a);

// Replaces the call's accel generators (and absent ones, for random operators) by CPU
// generators drawn from the accel generators of `device`, so CPU kernels can use them.
void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           c10::DeviceIndex device);

// Generators for the executor's kernels (executor.h): the CPU generators of
// substitute_generators (host), or CUDA generators holding the accel generators' Philox state
// (cuda), which the accel generators take back when the returned draws are destroyed (after the
// call; empty on the host).
std::vector<std::unique_ptr<device::CudaDraw>> substitute_kernel_generators(
    const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device);

// CPU indices (the Tensor?[] of index, index_put_; index_fill's index) go to accel `device`
// first, as CUDA's indexing moves them: the call then runs in stream order like any other.
void upload_cpu_indices(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::DeviceIndex device);

// Whether every result is a tensor or a list of tensors.
bool returns_only_tensors(const c10::FunctionSchema& schema);

// The argument a write-aliasing result refers to.
std::optional<size_t> aliased_argument(const c10::FunctionSchema& schema,
                                       const c10::Argument& result);

// True if some result is a view of an argument (aliases it without writing).
bool returns_view(const c10::FunctionSchema& schema);

// Runs the call again through the dispatcher, flagging `inside` meanwhile: the `cuda_like`
// function that makes it comes back with the same call and lets it through.
void call_again(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool& inside);

// If the call is an out= form ("out", "<name>_out"): runs its functional form (the overload
// without the suffix, through the dispatcher), writes the results into the out= tensors as
// CUDA's out= kernels do (resized where their shape differs; device and a safe cast checked),
// leaves them on the stack and returns true; otherwise false. For `cuda_like` functions whose
// functional form returns CUDA's results where the CPU's out= kernel would refuse the out=
// tensors shaped after them.
bool out_through_functional(const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Whether `schema` is an out= form (the overload "out" or "<name>_out").
bool is_out_form(const c10::FunctionSchema& schema);

// Converts the tensors at these stack positions to `dtype` (None and undefined ones stay).
void convert_tensors(torch::jit::Stack* stack, std::initializer_list<size_t> positions,
                     c10::ScalarType dtype);

}  // namespace accel::aten
