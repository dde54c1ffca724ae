// How the executor runs an underlying call whose results are known (the driver-dependent part of
// the underlying tier; underlying.cpp decides which calls take it): the results allocated from
// accel's allocator, the arguments stashed, and the kernel launched as a task on the stream (host
// driver, or run directly while a capture records elementwise replays) or on the accel stream
// by the cuda executor (executor.h).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include "aten/meta_cache.h"
#include "aten/underlying.h"
#include "aten/underlying_caller.h"

namespace accel::aten {

// Allocates the new results of the call on stack[begin:] (described by `shapes`) and enqueues
// its kernel. `results` gets the call's results in order: the new tensors, and for those that
// are an argument written in place (out=, in-place) that argument, or None where
// `copy_aliased` is false (the caller has it). `wait`: waits for the kernel (host executor),
// whose error then raises here with its type; returns whether the kernel warned.
// `config`/`info`: the operator's (underlying.cpp resolves `info` once per operator).
bool launch_call(const OpConfig& config, const SchemaInfo& info, const c10::OperatorHandle& op,
                 const torch::jit::Stack& stack, size_t begin, const CachedResult& shapes,
                 c10::DeviceIndex device, c10::SmallVectorImpl<c10::IValue>& results,
                 bool copy_aliased, bool wait = false);

}  // namespace accel::aten
