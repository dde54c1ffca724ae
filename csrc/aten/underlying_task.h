// The work of one underlying operator call: its arguments, stashed by value on the calling
// thread, and what runs the kernel of the executor's device (executor.h) on views of the accel
// memory: a task on the stream (host driver) or the caller itself (cuda).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/record_function.h>

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "aten/host_task.h"

namespace accel::aten {

// One argument of the CPU call, stashed by value for the task.
struct Arg {
  enum class Kind : uint8_t { Value, Tensor, TensorList, OptionalTensorList };
  Kind kind = Kind::Value;
  bool result = false;  // a new result the caller allocated, passed as the out= tensor
  c10::IValue value;
  Layout tensor;
  std::vector<Layout> list;
  std::vector<std::optional<Layout>> optional_list;

  // Fills this (cleared) slot with the work's copy of `v`: accel tensors by layout, CPU
  // tensors cloned (the caller may change them as soon as the call returns, as with CUDA),
  // accel device arguments turned into the executor's device (factories build there).
  // `write`: the call writes `v` (see Layout::of).
  void stash(const c10::IValue& v, bool write);
  // Back to an empty slot, keeping the lists' capacity (slots are reused by later calls).
  void reset();
  // The argument of the kernel's call (views on `storages`' device).
  c10::IValue materialize(KernelStorages& storages) const;
};

// The arguments of one call, filled on the calling thread and read by the task.
struct WorkBuffers {
  std::vector<Arg> slots;  // the first `count` are this call's arguments; the rest are spare
  size_t count = 0;
  std::vector<Layout> copy_into;  // functional results without an out= variant

  Arg& add() {
    if (count == slots.size()) slots.emplace_back();
    return slots[count++];
  }
  c10::ArrayRef<Arg> args() const { return {slots.data(), count}; }
  void clear();
};

// Efficient zero tensors (the ZeroTensor key, no memory: forward-mode AD's zero tangents) reach
// accel's kernels only for the operators ATen's ZeroTensor fallback lets through (dot, vdot): the
// arguments among the last `n` of `stack` become real zeros, as the fallback makes them for every
// other operator.
void materialize_zero_tensors(torch::jit::Stack& stack, size_t n);
// Whether the last `n` arguments on `stack` hold an efficient zero tensor.
bool has_zero_tensors(const torch::jit::Stack& stack, size_t n);

// Buffers for a call: from a pool of buffers whose tasks are done (see underlying_task.cpp).
std::unique_ptr<WorkBuffers> take_buffers();

struct RecycleBuffers {
  void operator()(WorkBuffers* b) const noexcept;
};

// The work of one operator call on the stream (small enough for the Task's inline storage).
struct Work {
  c10::OperatorHandle op;
  std::unique_ptr<WorkBuffers, RecycleBuffers> buf;
  // Computes into the results (copy_into) instead of running `op` (OpConfig::into).
  void (*into)(torch::jit::Stack& args, const std::vector<at::Tensor>& results) = nullptr;
  // Small work runs on the worker alone: an OpenMP team started for a few elements costs more
  // than the work, and its threads spin afterwards, taking a core from the calling thread.
  bool serial = false;

  // Runs the kernel on views made with `storages`. On the host (a task) a kernel's error is
  // reported at the next synchronizing call, naming the operator.
  void operator()(KernelStorages& storages) const;
  // The same for a task whose caller waits for it (run_on_stream): errors keep their type.
  void run_waited(KernelStorages& storages) const { run(storages); }

 private:
  void run(KernelStorages& storages) const;
};

// Below how many elements in every tensor a call runs without intra-op parallelism: ATen's grain
// size, ATen's own rule (matrix products are judged by their work instead: SerialRule::left).
int64_t serial_numel();

// Matrix products (mm, bmm, mv, addmm, baddbmm, addbmm, addmv, _addmm_activation, and their
// in-place and out= forms): the argument index of the left operand (the right one follows it),
// else -1. Their calls are judged by multiply-adds, not by elements: a decoder's step multiplies
// a [2, 1024] activation by a [1024, 4096] weight, 8M multiply-adds over a 4M-element tensor.
int matmul_left_operand(std::string_view name);

// When a call runs without intra-op parallelism (see underlying_task.cpp): fewer elements than
// serial_numel() in every tensor, or for matrix products few multiply-adds over small operands.
struct SerialRule {
  int left = -1;  // matrix products: matmul_left_operand, else -1
};

// Whether the call is small by `rule` (its kernel then runs without intra-op parallelism).
bool small_work(const WorkBuffers& buf, const SerialRule& rule);

// Whether stack[begin:] holds a number that kernels may refuse to convert on the host: a float
// that float32 cannot hold (finite, beyond its range) or, among tensors none of which is
// complex, a complex number with an imaginary part. Kernels convert such numbers and raise
// "value cannot be converted to type float without overflow" (lerp, clamp, fill_), at the call
// on CUDA: such calls run on the caller, so that their errors do too.
bool unconvertible_scalar(const torch::jit::Stack& stack, size_t begin);

struct CachedResult;
// The same rule for a call run on the calling thread (its arguments stack[begin:] and, where
// known, its results): the first call of a signature must compute what later calls, run as
// tasks, compute, bit for bit (a reduction split over threads rounds differently).
bool small_call(const torch::jit::Stack& stack, size_t begin, const CachedResult* results,
                const SerialRule& rule);

// Runs `kernel` as a task on the current stream of `device` (host driver) and waits for it,
// once the stream has drained: the calls accel runs synchronously (the first of each signature,
// those whose result shapes depend on the data) run their CPU kernels on the stream's worker,
// like every other call, and not on the calling thread. Each thread that runs an OpenMP region
// keeps a team of threads, and once the process holds more such threads than cores, libgomp
// stops letting them spin between regions: every region then waits for sleeping threads to
// wake (a 1x1 convolution took 451 us against 135 us with the caller's team gone). The
// kernel's exception rethrows here, with its type; its warnings go to the caller's handler.
// Returns whether the kernel warned.
bool run_on_stream(c10::DeviceIndex device, const char* what, const std::function<void()>& kernel);

// While alive, the calling thread records no operator for a profiler: the CPU kernel a task runs
// is the device work of the accel operator that launched it (the profiler shows it as that task's
// kernel event), not an operator of its own, also where the task runs on the launching thread
// (ACCEL_LAUNCH_BLOCKING). Switching RecordFunction off and on rebuilds the thread's callback
// lists (4,100 instructions a task, a third of a tiny add's task on the worker), so it is
// switched only while callbacks are registered: without any, no operator is recorded anyway.
class NotAnOperator {
 public:
  NotAnOperator();

 private:
  std::optional<at::DisableRecordFunctionGuard> off_;
};

// While alive, the calling thread's OpenMP work and MKL's calls run on one thread.
class SerialScope {
 public:
  SerialScope();
  ~SerialScope();
  SerialScope(const SerialScope&) = delete;
  SerialScope& operator=(const SerialScope&) = delete;

 private:
  int saved_ = 0;
  int saved_mkl_ = -1;  // MKL's thread-local count before (-1: no MKL)
};

}  // namespace accel::aten
