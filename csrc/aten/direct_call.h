// Running an operator's kernel (the executor device's) on accel memory, from the calling thread:
// see direct_call.cpp.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace accel::aten {

// Runs the operator's kernel of the executor's device on the calling thread, on tensors of that
// device over the accel memory of its arguments (dense or nested): the CPU's after the stream has
// drained (host), CUDA's in accel stream order (cuda); new results are copied to accel, results
// over an argument's memory alias it.
void direct_call(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace accel::aten
