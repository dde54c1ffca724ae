// The operator tiers of yaml/accel_functions.yaml and the kernel behind the `underlying` tier.
//
// Underlying: the ATen CPU kernel runs on accel memory (the host driver's device memory is host
// memory), without copying inputs or outputs, in stream order:
//  1. the output shapes, dtypes and strides are computed on the issuing thread by running the
//     operator on meta tensors (for out= operators this also computes the resize), and cached
//     per operator by the arguments' metadata so repeated calls skip the meta kernel;
//  2. the outputs are allocated on the issuing thread (stream-ordered caching allocator);
//  3. one task on the current stream builds CPU tensors over the accel buffers and runs the CPU
//     kernel (the out= variant for functional operators, so results land in place).
// Operators whose result shapes depend on data (nonzero, masked_select, unique) synchronize the
// stream and run on the issuing thread instead.
#pragma once

#include <torch/library.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace accel::aten {

enum class Tier : uint8_t { Native, Underlying, CpuFallback, Error };

// One generated entry per registered operator (see codegen/gen_accel.py).
struct OpConfig {
  const char* name;  // "aten::add.Tensor"
  Tier host;         // the tier per driver
  Tier cuda;
  Tier level_zero;
  const char* cpu_op;       // underlying: the operator to run on the CPU ("" = this one)
  const char* out_variant;  // underlying functional operators: the out= overload ("" = none)
  const char* functional;   // underlying out= operators with several outputs: the functional
                            // overload to run, copying into the outputs ("" = none)
  bool sync;                // underlying: the result shapes depend on the data
  bool metadata_only;       // underlying: reads no tensor data (runs on the caller, no wait)
  bool contiguous_results;  // underlying: results contiguous, whatever the CPU kernel returns
  uint64_t dtypes;          // bit i: ScalarType i of the first tensor argument runs underlying;
                            // 0 = every dtype; other dtypes take the CPU fallback
  // Computes the results on meta tensors through the C++ meta function (a boxed call on the
  // stack); nullptr: through the dispatcher's Meta kernel.
  void (*meta)(torch::jit::Stack* stack);
  // Underlying functional operators with several results: the task calls this with CPU views
  // of the arguments and of the results allocated for them, and it computes straight into the
  // results (nullptr: the task runs the CPU operator and copies its results).
  void (*into)(torch::jit::Stack& args, const std::vector<at::Tensor>& results);
  // Dtypes CUDA's kernel takes and the CPU's does not: pairs (from, to) of ScalarType codes,
  // ended by -1. A call whose first tensor argument has dtype `from` runs with its `from`
  // tensors converted to `to`, and the results converted back (nullptr: none).
  const int8_t* widen;
  // Handles the calls CUDA's kernel takes and the CPU's refuses (nansum of complex tensors),
  // returning true; false: the call runs as usual (nullptr: none).
  bool (*cuda_like)(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  // Whether cuda_like acts on (handles or changes the arguments of) a call (nullptr: it may act
  // on any, and every call takes the boxed kernel; see AsyncPath).
  bool (*cuda_like_when)(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
  const char* reason;  // error tier: why the operator is refused
};

// Runs the call with the dtypes OpConfig::widen names converted (false: nothing to widen).
bool widened_call(const OpConfig& config, const c10::OperatorHandle& op, torch::jit::Stack* stack);
// Whether widened_call may convert something in this call.
bool may_widen(const OpConfig& config, const c10::OperatorHandle& op,
               const torch::jit::Stack& stack);

// The asynchronous path of an underlying operator's kernel, for its typed entry (typed_kernel.h).
class AsyncPath {
 public:
  virtual ~AsyncPath() = default;
  // Runs the call whose arguments are the whole of `stack` as the boxed kernel would, where that
  // runs it asynchronously with result metadata cached for its signature, and returns true with
  // the call's results in `results`: the new tensors, and None for each result that is an
  // argument written in place (out=, in-place). False, having run nothing, for every other call
  // (the first of a signature, one the CPU fallback takes, ...): the boxed kernel runs those.
  // `stack` is left as it is: its tensors may be borrowed (held without a reference of their
  // own), so nothing may keep, move or drop them.
  virtual bool call_async(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          c10::SmallVectorImpl<c10::IValue>& results) = 0;
};

// The calling thread's calls of typed entries so far: run asynchronously on borrowed arguments,
// and sent to the boxed kernel (for tests).
struct TypedCalls {
  uint64_t borrowed = 0;
  uint64_t boxed = 0;
};
TypedCalls& typed_calls();

// The boxed kernel of an operator of the underlying tier, and its asynchronous path (owned by
// the kernel).
std::pair<c10::BoxedKernel, AsyncPath*> make_underlying(const OpConfig& config);

// The boxed kernel registered for an operator of the underlying, cpu_fallback or error tier.
// `native`: the accel kernel of an operator native on some drivers (their tier Native), which
// runs there.
torch::CppFunction make_kernel(const OpConfig& config, c10::KernelFunction native = {});

// For benchmarks: route every underlying operator through the CPU fallback instead.
void set_force_fallback(bool force);
bool force_fallback();

}  // namespace accel::aten
