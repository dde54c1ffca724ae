#include "aten/underlying.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aten/dispatch_util.h"
#include "aten/executor.h"
#include "aten/fallback.h"
#include "aten/host_task.h"
#include "aten/meta_cache.h"
#include "aten/meta_functions.h"
#include "aten/results.h"
#include "aten/typed_kernel.h"
#include "aten/underlying_caller.h"
#include "aten/underlying_launch.h"
#include "aten/underlying_task.h"
#include "device/allocator.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

std::atomic<bool> g_force_fallback{false};

// The tier of an operator for the driver this process runs on.
Tier driver_tier(const OpConfig& c) {
  static const int driver = [] {
    const std::string name = device::call([] { return std::string(rt::driver_name()); });
    return name == "cuda" ? 1 : name == "level_zero" ? 2 : 0;
  }();
  return driver == 1 ? c.cuda : driver == 2 ? c.level_zero : c.host;
}

// "aten::add.out"
c10::OperatorHandle find_operator(const char* full) {
  const std::string name(full);
  const size_t dot = name.find('.');
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      name.substr(0, dot).c_str(), dot == std::string::npos ? "" : name.c_str() + dot + 1);
}

class UnderlyingKernel final : public c10::OperatorKernel, public AsyncPath {
 public:
  UnderlyingKernel(const OpConfig* config, c10::KernelFunction native)
      : config_(config),
        native_(std::move(native)),
        foreach_(std::string(config->name).rfind("aten::_foreach_", 0) == 0),
        float_shapes_(std::string(config->name).rfind("aten::arange", 0) == 0) {}

  // (call_async repeats the routes below for typed entries: a change here belongs there too.)
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const OpConfig& c = *config_;
    resolve_ops(op);
    // arange's checks, on every path, as the CPU's kernel makes them (and one it lacks), and
    // its length (enqueue: arange_length_matches).
    std::optional<int64_t> arange_length;
    if (float_shapes_) {
      arange_length = arange_call_length(*stack, stack->size() - op.schema().arguments().size(),
                                         info_.has_out_arguments);
    }
    if (info_.zero_tensor_args) materialize_zero_tensors(*stack, op.schema().arguments().size());
    // The CPU fallback runs the cpu_op where there is one (the CPU has no kernel for
    // convolution_overrideable, for one).
    const c10::OperatorHandle& fallback_op = info_.kernel(op);
    switch (driver_tier(c)) {
      case Tier::Error:
        TORCH_CHECK_NOT_IMPLEMENTED(false, c.name, " is not supported on accel: ", c.reason);
      case Tier::Native:  // native on this driver, another tier on others
        if (native_.isValid()) {
          native_.callBoxed(op, keys, stack);
          return;
        }
        cpu_fallback(fallback_op, stack);
        return;
      case Tier::CpuFallback: cpu_fallback(fallback_op, stack); return;
      case Tier::Underlying: break;
    }
    if (c.widen != nullptr && widened_call(c, op, stack)) return;
    // cuda_like and dtypes describe what the CPU's kernels refuse: the host executor's concern.
    const Executor ex = executor();
    if (c.cuda_like != nullptr && ex == Executor::Host && c.cuda_like(op, stack)) return;
    // _foreach_ lists on several devices: the CPU's kernel, a loop over the tensors, runs each
    // tensor's operator on that tensor's device (and driver), as CUDA's slow path does.
    if (foreach_ && foreach_lists_span_devices(op, *stack)) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      return;
    }
    if (g_force_fallback.load(std::memory_order_relaxed) || ex == Executor::None ||
        (ex == Executor::Host && !dtype_allowed(c, op, *stack))) {
      cpu_fallback(fallback_op, stack);
      return;
    }
    if (info_.has_index_list) check_index_devices(op, *stack);
    const c10::DeviceIndex device = call_device(op, *stack, c.name);
    c10::DeviceGuard guard(c10::Device(kAccel, device));
    if (info_.has_index_list) upload_cpu_indices(op, stack, device);
    // Random operators: CPU generators from the accel ones (host), or CUDA generators with their
    // Philox state, handed back after the launch (cuda); in a capture, numbered per replay.
    std::vector<std::unique_ptr<device::CudaDraw>> draws;
    if (info_.has_generator) draws = substitute_kernel_generators(op, stack, device);
    if (c.metadata_only) {
      call_on_caller(op, stack, device, /*synchronize=*/false);
    } else if (c.sync || !info_.tensor_returns_only || !enqueue(op, stack, device, arange_length)) {
      call_on_caller(op, stack, device, /*synchronize=*/true);
    }
  }

  // operator()'s path for the calls it runs asynchronously from a cached signature, alone, and
  // without touching `stack` (see AsyncPath).
  bool call_async(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                  c10::SmallVectorImpl<c10::IValue>& results) override {
    const OpConfig& c = *config_;
    resolve_ops(op);
    const size_t n = op.schema().arguments().size();
    // The calls operator() sends elsewhere (where a cuda_like function may act).
    if ((info_.zero_tensor_args && has_zero_tensors(stack, n)) ||
        driver_tier(c) != Tier::Underlying || c.metadata_only || c.sync ||
        !info_.tensor_returns_only || info_.has_index_list || info_.has_generator ||
        may_widen(c, op, stack) || (foreach_ && foreach_lists_span_devices(op, stack))) {
      return false;
    }
    const Executor ex = executor();
    if (g_force_fallback.load(std::memory_order_relaxed) || ex == Executor::None ||
        (ex == Executor::Host && !dtype_allowed(c, op, stack)) ||
        (ex == Executor::Host && c.cuda_like != nullptr &&
         (c.cuda_like_when == nullptr || c.cuda_like_when(op, stack)))) {
      return false;
    }
    const c10::DeviceIndex device = call_device(op, stack, c.name);
    c10::DeviceGuard guard(c10::Device(kAccel, device));
    const size_t begin = stack.size() - n;
    if (unconvertible_scalar(stack, begin)) return false;
    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    if (!encode_call(stack, begin, key_options(), key)) return false;
    const std::shared_ptr<const CachedResult> shapes = cache_.find(key);
    if (!shapes || shapes->run_on_caller ||
        !shapes->launch_checked.load(std::memory_order_acquire)) {
      return false;
    }
    resize_written(info_, *shapes, stack, begin);
    launch_call(*config_, info_, op, stack, begin, *shapes, device, results,
                /*copy_aliased=*/false);
    return true;
  }

 private:
  // Indices on a device other than the CPU's and the indexed tensor's: ATen's indexing error
  // (a CPU tensor indexed with accel indices, accel:0 with accel:1), as CUDA raises it.
  static void check_index_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
    const size_t begin = stack.size() - op.schema().arguments().size();
    const c10::IValue& self = stack[begin];
    if (!self.isTensor() || !self.toTensor().defined()) return;
    const c10::Device device = self.toTensor().device();
    for (size_t i = begin + 1; i < stack.size(); ++i) {
      if (!is_optional_tensor_list(stack[i])) continue;
      for (const c10::IValue& e : stack[i].toListRef()) {
        if (!e.isTensor() || !e.toTensor().defined()) continue;
        const c10::Device d = e.toTensor().device();
        TORCH_CHECK(d.is_cpu() || d == device, "indices should be either on ", c10::kCPU,
                    " or on the same device as the indexed tensor (", device, ")");
      }
    }
  }

  static bool dtype_allowed(const OpConfig& c, const c10::OperatorHandle& op,
                            const torch::jit::Stack& stack) {
    if (c.dtypes == 0) return true;
    const size_t n = op.schema().arguments().size();
    for (size_t i = stack.size() - n; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      c10::ScalarType st = c10::ScalarType::Undefined;
      if (v.isTensor() && v.toTensor().defined()) {
        st = v.toTensor().scalar_type();
      } else if (v.isTensorList() && !v.toTensorList().empty()) {
        st = v.toTensorList().get(0).scalar_type();
      } else {
        continue;
      }
      return (c.dtypes >> static_cast<int>(st)) & 1u;
    }
    return true;
  }

  void resolve_ops(const c10::OperatorHandle& op) {
    std::call_once(resolved_, [&] {
      const c10::FunctionSchema& schema = op.schema();
      for (const c10::Argument& r : schema.returns()) {
        info_.return_alias.push_back(aliased_argument(schema, r));
      }
      // native_batch_norm updates its running statistics in training without saying so in its
      // schema: they are written too (a copy-on-write one gets its own memory first, as the
      // CPU kernel's write gives it; else the write reached the tensor it was lazily cloned from).
      const bool unannotated_stats =
          std::string_view(config_->name) == "aten::native_batch_norm" ||
          std::string_view(config_->name) == "aten::native_batch_norm.out";
      for (const c10::Argument& a : schema.arguments()) {
        info_.write_argument.push_back(
            (a.alias_info() != nullptr && a.alias_info()->isWrite()) ||
            (unannotated_stats && (a.name() == "running_mean" || a.name() == "running_var")));
        info_.out_argument.push_back(info_.write_argument.back() && a.is_out());
        info_.has_write_arguments = info_.has_write_arguments || info_.write_argument.back();
        info_.has_out_arguments = info_.has_out_arguments || info_.out_argument.back();
        const c10::TypePtr& t = a.type();
        info_.has_generator = info_.has_generator || is_generator_argument(a);
        info_.has_index_list =
            info_.has_index_list ||
            (std::string_view(config_->name).starts_with("aten::index_fill") &&
             a.name() == "index") ||
            (t->kind() == c10::TypeKind::ListType &&
             t->containedType(0)->kind() == c10::TypeKind::OptionalType &&
             t->containedType(0)->containedType(0)->kind() == c10::TypeKind::TensorType);
      }
      info_.tensor_returns_only = returns_only_tensors(schema);
      info_.zero_tensor_args = op.hasKernelForDispatchKey(c10::DispatchKey::ZeroTensor);
      info_.serial = {matmul_left_operand(config_->name)};
      info_.cpu_op = find_op(config_->cpu_op);
      info_.out_op = find_op(config_->out_variant);
      info_.functional_op = find_op(config_->functional);
      key_options_.list_values = !foreach_;
      key_options_.float_values = !foreach_;  // _foreach_ scalars change every step
      key_options_.aliasing = info_.has_write_arguments && !foreach_;
    });
  }

  static std::optional<c10::OperatorHandle> find_op(const char* full) {
    if (full == nullptr || *full == '\0') return std::nullopt;
    return find_operator(full);
  }

  // The result metadata, the allocation of results and the task. False if the call must run
  // synchronously instead (no meta kernel, a CPU tensor with elements among the arguments, a
  // kernel the meta functions do not describe). `arange_length`: arange's, as its CPU kernel
  // computes it (operator()); nullopt for other operators.
  bool enqueue(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
               std::optional<int64_t> arange_length) {
    const c10::FunctionSchema& schema = op.schema();
    const size_t n = schema.arguments().size();
    const size_t begin = stack->size() - n;
    if (unconvertible_scalar(*stack, begin)) return false;

    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    const KeyOptions options = key_options();
    bool has_floats = false;
    const bool cacheable = encode_call(*stack, begin, options, key, &has_floats);
    std::shared_ptr<const CachedResult> shapes = cacheable ? cache_.find(key) : nullptr;
    KeyOptions keyed = options;  // what `key` describes
    if (!shapes && cacheable && has_floats && options.float_values && !keeps_floats()) {
      // A miss keyed on float values: where they keep changing (a learning rate), key calls
      // on their types instead, so they stay asynchronous.
      thread_local std::string type_key;
      type_key.clear();
      KeyOptions by_type = options;
      by_type.float_values = false;
      encode_call(*stack, begin, by_type, type_key);
      if (floats_vary_.varies(type_key, key)) {
        key = type_key;
        keyed.float_values = false;
        shapes = cache_.find(key);
      }
    }
    const bool miss = shapes == nullptr;
    if (miss) {
      const std::string miss_key = key;  // the meta pass below may run operators on this thread
      std::shared_ptr<CachedResult> computed =
          meta_results(info_.kernel(op), config_->meta, *stack, begin);
      if (computed && config_->contiguous_results) make_contiguous(*computed);
      if (!computed) {
        // No meta kernel, or a result shape that depends on the data: always synchronous.
        if (cacheable) {
          auto sync = std::make_shared<CachedResult>();
          sync->run_on_caller = true;
          cache_.insert(miss_key, std::move(sync));
        }
        return false;
      }
      const bool capture = capturing_anywhere();
      // Trusted: the meta function's results are the call's and nothing is left for the
      // kernel to refuse (arange_length_matches), or nothing may wait (a capture).
      // out= tensors that are empty or of the result's size: the CPU kernel would resize them
      // without a warning (it warns where it resizes one with elements).
      const bool outs_fit = written_outputs_fit(*computed, *stack, begin);
      const bool trusted = capture || (outs_fit && arange_length &&
                                       arange_length_matches(*computed, *arange_length));
      bool exact = !trusted && outs_fit && exact_first_call();
      std::string family;  // the call's key without its layouts (exact calls)
      if (exact) {
        KeyOptions by_family = keyed;
        by_family.layouts = false;
        if (!cacheable || !encode_call(*stack, begin, by_family, family)) family.clear();
      }
      if (exact && (family.empty() || !families_.contains(family))) {
        // The first call of a signature whose C++ meta function is its CPU kernel's own (a
        // structured kernel's): its results are known exactly, so it runs as later calls will,
        // straight into accel memory, and waits for its task, whose errors raise here with
        // their type. (The CPU's functional kernel below would allocate the results in CPU
        // memory, to be copied into accel memory: twice the traffic for large results.) Once
        // a call of its family (the same arguments but for their shapes) ran without an error
        // or a warning, the family's new shapes run asynchronously, as cached calls do: what
        // the kernel may still refuse depends on the data (gather's indices), and such errors
        // come at the next synchronization, as a CUDA kernel's do. Where the task fails and
        // the call writes no argument, the CPU's own kernel decides below: the call's error, or
        // results the meta function did not predict (isin of a Scalar: [0], then resized).
        // An out= call (mul_ of a Scalar is one, into self) resizes its out= tensors first, as
        // the CPU kernel does once its meta function passed: an error its kernel finds then
        // leaves them resized, as on the CPU.
        if (info_.has_out_arguments) resize_written(info_, *computed, *stack, begin);
        c10::SmallVector<c10::IValue, 3> results;
        const std::optional<bool> warned =
            launch_waited(op, *stack, begin, *computed, device, results);
        exact = warned.has_value();
        if (exact) {
          computed->run_on_caller = *warned;
          if (!computed->run_on_caller && !family.empty()) families_.insert(family);
          if (cacheable) cache_.insert(miss_key, std::move(computed));
          torch::jit::drop(*stack, n);
          for (c10::IValue& r : results) stack->push_back(std::move(r));
          return true;
        }
      }
      if (!exact && !trusted) {
        // The first call of a signature runs on the caller: its errors are raised here, at the
        // call, like CUDA's argument checks, and its actual results are what later calls
        // allocate (meta functions do not always describe what the CPU kernel returns: batch
        // norm's statistics in eval mode, strides). A call that raises is not cached, and
        // leaves its out= tensors as they were (the CPU kernel checks before it resizes).
        const std::vector<std::optional<Layout>> before = written_layouts(info_, *stack, begin);
        // Empty out= tensors get their size here where a C++ meta function (the one the CPU
        // kernel runs) gave it; others are for the CPU kernel to judge (it resizes only where
        // the element count differs: logspace into a [2, 2] view keeps it). Python meta
        // functions can disagree with the CPU kernel (batch norm's statistics in eval mode).
        if (config_->meta != nullptr)
          resize_written(info_, *computed, *stack, begin, /*only_empty=*/true);
        std::shared_ptr<CachedResult> seen;
        try {
          seen = call_on_caller(op, stack, device, true, computed.get());
        } catch (...) {
          restore_written(before, *stack, begin);
          throw;
        }
        if (launch_differs(*seen)) seen->launch_checked.store(false, std::memory_order_relaxed);
        if (cacheable) cache_.insert(miss_key, std::move(seen));
        return true;
      }
      resize_written(info_, *computed, *stack, begin);
      // During graph capture nothing may synchronize; arange's new lengths need not wait.
      if (cacheable) cache_.insert(miss_key, computed);
      shapes = std::move(computed);
    } else {
      if (shapes->run_on_caller) return false;
      resize_written(info_, *shapes, *stack, begin);
      if (!shapes->launch_checked.load(std::memory_order_acquire)) {
        return first_launch(op, stack, begin, *shapes, device, key);
      }
    }

    c10::SmallVector<c10::IValue, 3> results;
    launch_call(*config_, info_, op, *stack, begin, *shapes, device, results,
                /*copy_aliased=*/true);
    torch::jit::drop(*stack, n);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return true;
  }

  // The first launch of a signature whose first call ran the CPU's own kernel (flip of uint1)
  // takes a path that call did not (flip into the results, whose copy refuses uint1): it waits,
  // so that an error raises here, not at the next synchronization. Not in captures.
  bool first_launch(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin,
                    const CachedResult& shapes, c10::DeviceIndex device, const std::string& key) {
    const size_t n = stack->size() - begin;
    c10::SmallVector<c10::IValue, 3> results;
    const bool host = executor() == Executor::Host;
    if (!host || capturing_anywhere()) {
      // The cuda executor launches at the call, where errors raise anyway: checked for good.
      if (!host) shapes.launch_checked.store(true, std::memory_order_release);
      launch_call(*config_, info_, op, *stack, begin, shapes, device, results,
                  /*copy_aliased=*/true);
    } else {
      const std::string checked_key = key;  // the kernel may run operators on this thread
      // A call that writes an argument raises here; the next call waits too.
      const std::optional<bool> ran = launch_waited(op, *stack, begin, shapes, device, results);
      const bool refused = !ran.has_value();
      const bool warned = ran.value_or(false);
      // Refused: the first call's path raises the call's own error (an index out of range; the
      // key stays unchecked) or takes the call (flip of uint1), as later calls with it then do.
      if (refused) call_on_caller(op, stack, device, /*synchronize=*/true);
      if (warned || refused) {
        // As a first call that warned: calls with this key run on the caller (and warn there).
        auto sync = std::make_shared<CachedResult>();
        sync->run_on_caller = true;
        cache_.insert(checked_key, std::move(sync));
        if (refused) return true;  // ran on the caller (the task's results were never written)
      }
      shapes.launch_checked.store(true, std::memory_order_release);
    }
    torch::jit::drop(*stack, n);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return true;
  }

  // launch_call's task, waited for: whether the kernel warned, or nullopt where it failed and
  // the call writes no argument (the CPU's own kernel on the caller then decides: the call's
  // error, or what the task refused). A failed call that writes an argument raises its error.
  std::optional<bool> launch_waited(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                    size_t begin, const CachedResult& shapes,
                                    c10::DeviceIndex device,
                                    c10::SmallVectorImpl<c10::IValue>& results) {
    try {
      return launch_call(*config_, info_, op, stack, begin, shapes, device, results,
                         /*copy_aliased=*/true,
                         /*wait=*/true);
    } catch (...) {
      if (info_.has_write_arguments) throw;
      return std::nullopt;
    }
  }

  // Whether each out= tensor of the call is empty or already of the result's sizes.
  bool written_outputs_fit(const CachedResult& computed, const torch::jit::Stack& stack,
                           size_t begin) const {
    if (!info_.has_out_arguments) return true;
    for (size_t k = 0; k < info_.out_argument.size(); ++k) {
      if (!info_.out_argument[k]) continue;
      const at::Tensor& out = stack[begin + k].toTensor();
      const std::optional<TensorMeta>& after = computed.written[k];
      if (!after || (out.numel() != 0 && out.sizes() != c10::IntArrayRef(after->sizes))) {
        return false;
      }
    }
    return true;
  }

  // arange, whose values (in its key) decide its length: a training step at a new sequence
  // length called it first and waited for the stream. operator() made the CPU kernel's checks
  // (arange_call_length), its kernel reads no data that could fail later, and the length is
  // known: the call runs as later calls do, where PyTorch's meta function gives the CPU's
  // length (not where the kernel's integer arithmetic overflows).
  static bool arange_length_matches(const CachedResult& computed, int64_t length) {
    return computed.results.size() == 1 && computed.results[0].size() == 1 &&
           c10::IntArrayRef(computed.results[0][0].sizes) == c10::IntArrayRef{length};
  }

  // Float values stay in the key of arange (they decide its shape) and of random operators
  // (their checks read them: uniform_'s range; their values rarely change per step).
  bool keeps_floats() const { return float_shapes_ || info_.has_generator; }

  KeyOptions key_options() const {
    KeyOptions options = key_options_;
    options.float_values = options.float_values && (keeps_floats() || !floats_vary_.varies());
    return options;
  }

  // Whether a first call (not captured) may run as later calls do (see enqueue): the meta
  // function is the CPU kernel's (the host executor's). In-place calls write where the CPU
  // kernel would; out= calls whose out= tensors fit (written_outputs_fit) too, once resized.
  bool exact_first_call() const { return config_->meta != nullptr && executor() == Executor::Host; }

  // Whether later calls of a signature whose first call ran on the caller run another kernel
  // (first_launch checks them): an out= form or `into` function writing the results, an out=
  // call's functional form, a copy the CPU refuses. Else the second call need not wait.
  bool launch_differs(const CachedResult& seen) const {
    return info_.functional_op || (info_.out_op && !info_.cpu_op) || config_->into != nullptr ||
           !cpu_copies_results(seen);
  }

  // While any device captures, a first call does not wait for its task: a capture in global
  // mode forbids waiting on every stream, and the call itself is asynchronous.
  static bool capturing_anywhere() {
    return device::call([] {
      for (int d = 0, n = rt::device_count(); d < n; ++d) {
        if (rt::device_is_capturing(d)) return true;
      }
      return false;
    });
  }

  // The synchronous path (underlying_caller.h).
  std::shared_ptr<CachedResult> call_on_caller(const c10::OperatorHandle& op,
                                               torch::jit::Stack* stack, c10::DeviceIndex device,
                                               bool synchronize,
                                               const CachedResult* expected = nullptr) {
    return run_on_caller(*config_, info_, op, stack, device, synchronize, expected);
  }

  const OpConfig* config_;
  const c10::KernelFunction native_;  // where the operator is native (see make_kernel)
  const bool foreach_;
  const bool float_shapes_;  // floating-point arguments decide result shapes (arange)
  SchemaInfo info_;          // set by resolve_ops
  KeyOptions key_options_;   // set by resolve_ops
  FloatVariation floats_vary_;
  Families families_;  // of exact first calls that ran at the call (see enqueue)
  MetaCache cache_;
  std::once_flag resolved_;
};

}  // namespace

torch::CppFunction make_kernel(const OpConfig& config, c10::KernelFunction native) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<UnderlyingKernel>(&config, std::move(native)));
}

TypedCalls& typed_calls() {
  thread_local TypedCalls calls;
  return calls;
}

c10::OperatorHandle typed::Entry::find(const char* name) {
  return find_operator(name);
}

std::pair<c10::BoxedKernel, AsyncPath*> make_underlying(const OpConfig& config) {
  auto kernel = std::make_unique<UnderlyingKernel>(&config, c10::KernelFunction());
  AsyncPath* async = kernel.get();
  return {c10::BoxedKernel::makeFromFunctor(std::move(kernel)), async};
}

void set_force_fallback(bool force) {
  g_force_fallback.store(force);
}
bool force_fallback() {
  return g_force_fallback.load();
}

}  // namespace accel::aten
