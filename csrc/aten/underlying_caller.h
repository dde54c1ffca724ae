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
  std::optional<c10::OperatorHandle> cpu_op;         // OpConfig::cpu_op, where there is one
  std::optional<c10::OperatorHandle> out_op;         // OpConfig::out_variant
  std::optional<c10::OperatorHandle> functional_op;  // OpConfig::functional

  // The operator whose CPU kernel runs the call of `op`.
  const c10::OperatorHandle& kernel(const c10::OperatorHandle& op) const {
    return cpu_op ? *cpu_op : op;
  }
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
// The CPU operator called is info.kernel(op) (OpConfig::cpu_op, else `op`).
std::shared_ptr<CachedResult> run_on_caller(const OpConfig& config, const SchemaInfo& info,
                                            const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                            c10::DeviceIndex device, bool synchronize,
                                            const CachedResult* expected = nullptr);

// Whether the CPU's copy kernel copies every result in `r` (cpu_copy_takes, host_task.h).
bool cpu_copies_results(const CachedResult& r);

// out= arguments the meta pass resized get the same shape on accel. Tensors written in place
// never change shape (some Python meta functions resize them, atan2_'s: the CPU kernel then
// refuses the call, on the caller). `only_empty`: only the empty out= tensors the kernel would
// resize (before a first call runs).
void resize_written(const SchemaInfo& info, const CachedResult& shapes,
                    const torch::jit::Stack& stack, size_t begin, bool only_empty = false);

// The layouts of the written accel tensors, before a call that may resize them.
std::vector<std::optional<Layout>> written_layouts(const SchemaInfo& info,
                                                   const torch::jit::Stack& stack, size_t begin);

// Gives written tensors back the sizes, strides and offset they had (storage that grew stays
// grown: its first bytes are the old contents).
void restore_written(const std::vector<std::optional<Layout>>& layouts,
                     const torch::jit::Stack& stack, size_t begin);

}  // namespace accel::aten
