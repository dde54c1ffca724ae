// Nested tensors on accel: see nested.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace accel::aten {

// Runs an operator whose arguments or results are nested tensors: the CPU kernel on CPU
// tensors over the accel memory, on the calling thread after the stream has drained.
void nested_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace accel::aten
