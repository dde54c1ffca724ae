// Helpers shared by the boxed kernels (the CPU fallback and the underlying tier).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <string>
#include <string_view>

namespace accel::aten {

// "aten::add.Tensor"
std::string op_name(const c10::OperatorHandle& op);

// The accel device a call runs on: that of its accel tensor and device arguments (the current
// device if none). Refuses arguments on two accel devices, like CUDA, and an accel generator
// without accel tensors.
c10::DeviceIndex call_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                             std::string_view name);

// Like CUDA kernels, accel operators take CPU tensors next to accel tensors only as 0-dim
// scalars: refuses any other CPU tensor argument, alone or in a tensor list, with the
// same-device error. Indices (Tensor?[] arguments of index/index_put) may be CPU tensors, and
// so may the tensors of scalars of _foreach_ operators, as on CUDA. Calls without accel tensors
// are not checked.
void check_cpu_tensors_are_scalars(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                   c10::DeviceIndex device, std::string_view name);

// Replaces the call's accel generators (and absent ones, for random operators) by CPU
// generators drawn from the accel generators of `device`, so CPU kernels can use them.
void substitute_generators(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           c10::DeviceIndex device);

// True if some result is a view of an argument (aliases it without writing).
bool returns_view(const c10::FunctionSchema& schema);

}  // namespace accel::aten
