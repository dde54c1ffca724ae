// The CPU fallback: operators without an accel kernel run on the CPU, visibly.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace accel::aten {

enum class FallbackMode { Warn, Silent, Error };

// Runs an operator through the CPU fallback (the boxed kernel registered for PrivateUse1).
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Refuses, with a RuntimeError naming the problem, inputs on which an operator's CPU kernel
// crashes the process instead of checking them (on the CPU device too), before accel runs that
// kernel on its memory (underlying tier) or through the fallback (norm.cpp).
void check_cpu_kernel_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

// The mode starts from ACCEL_FALLBACK (warn, silent or error; warn by default).
FallbackMode fallback_mode();
void set_fallback_mode(FallbackMode mode);
// "warn", "silent", "error" <-> mode; returns false for anything else.
bool parse_fallback_mode(const std::string& text, FallbackMode* mode);
const char* fallback_mode_name(FallbackMode mode);

// For work that goes through the host for want of a kernel (a driver without an executor):
// refuses under ACCEL_FALLBACK=error or during capture, else counts the call and warns once, as
// the CPU fallback does for `name`.
void host_round_trip(const std::string& name, c10::DeviceIndex device);

// Another library's operators (namespace `ns`) with a kernel for the executor's device (the CPU
// on the host driver, CUDA on cuda) and a CompositeExplicitAutograd one, but no accel kernel,
// get one that runs the executor device's kernel on accel memory, as the fallback runs those
// without a composite kernel: accel would otherwise take the composite, a decomposition for
// devices with no kernel of their own (torchaudio's lfilter loop: one small operator per
// sample, 26x slower than its CPU kernel). Where the driver has no executor, or the operator
// no kernel for it, the kernel calls the composite. Does not initialize the runtime. Returns the
// operators it registered.
std::vector<std::string> prefer_executor_kernels(const std::string& ns);

// Calls that went through the CPU fallback, per operator ("aten::add.Tensor").
std::vector<std::pair<std::string, int64_t>> fallback_stats();
void reset_fallback_stats();

}  // namespace accel::aten
