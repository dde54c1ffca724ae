// The synchronous path of the underlying tier: the CPU kernel called from the issuing thread on
// CPU views of the accel memory (see run_on_caller), and what it shares with the asynchronous
// path of underlying.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <memory>
#include <optional>
#include <vector>

#include "aten/meta_cache.h"
#include "aten/underlying.h"
#include "aten/underlying_task.h"
#include "device/common.h"

namespace accel::aten {

// What an underlying kernel knows about its operator's schema, computed once (underlying.cpp).
struct SchemaInfo {
  std::vector<std::optional<size_t>> return_alias;  // per result: the argument it writes
  std::vector<bool> write_argument;                 // per argument: written (out=, in-place)
  std::vector<bool> out_argument;                   // per argument: an out= tensor
  bool tensor_returns_only = true;                  // results are tensors or tensor lists
  bool has_write_arguments = false;
  bool has_out_arguments = false;
  bool has_generator = false;
  bool has_index_list = false;    // a Tensor?[] argument (indices)
  bool zero_tensor_args = false;  // ATen passes efficient zero tensors through (dot, vdot)
  SerialRule serial;              // which calls run without intra-op parallelism
};

// Written copy-on-write tensors get their own memory before any argument is described: a tensor
// read in the same call through a shared storage then sees that memory too.
void materialize_written(const SchemaInfo& info, const torch::jit::Stack& stack, size_t begin);

// Runs the CPU kernel on the calling thread on CPU views of the accel memory (no copy of the
// arguments; new results are copied to accel), after the stream has drained: for results
// whose shapes depend on the data, non-tensor results, calls the meta pass cannot represent,
// and the first call of each signature. Operators that read no tensor data (metadata_only)
// do not wait. Returns the metadata of the results and of the written arguments afterwards.
// `expected`: the results the meta pass computed, where known (they decide, with the
// arguments, whether the kernel runs serially, as the task of a later call would).
// `kernel`: the CPU operator to call (OpConfig::cpu_op, else `op`).
std::shared_ptr<CachedResult> run_on_caller(const OpConfig& config, const SchemaInfo& info,
                                            const c10::OperatorHandle& kernel,
                                            const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                            c10::DeviceIndex device, bool synchronize,
                                            const CachedResult* expected = nullptr);

// Whether the CPU's copy kernel copies every result in `r` (cpu_copy_takes, host_task.h).
bool cpu_copies_results(const CachedResult& r);

}  // namespace accel::aten
