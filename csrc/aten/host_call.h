// Running an operator's CPU kernel on accel memory, synchronously: see host_call.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace accel::aten {

// Runs the operator's CPU kernel on the calling thread, on CPU tensors over the accel memory
// of its arguments (dense or nested), after the stream has drained; new results are copied to
// accel, results over an argument's memory alias it.
void host_call(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace accel::aten
