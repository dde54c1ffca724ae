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
#include "aten/replay_kernels.h"
#include "aten/results.h"
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

bool is_accel(const at::Tensor& t) {
  return t.defined() && t.device().type() == kAccel;
}

class UnderlyingKernel final : public c10::OperatorKernel {
 public:
  UnderlyingKernel(const OpConfig* config, c10::KernelFunction native)
      : config_(config),
        native_(std::move(native)),
        foreach_(std::string(config->name).rfind("aten::_foreach_", 0) == 0),
        float_shapes_(std::string(config->name).rfind("aten::arange", 0) == 0) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
    const OpConfig& c = *config_;
    resolve_ops(op);
    if (info_.zero_tensor_args) materialize_zero_tensors(*stack, op.schema().arguments().size());
    // The CPU fallback runs the cpu_op where there is one (the CPU has no kernel for
    // convolution_overrideable, for one).
    const c10::OperatorHandle& fallback_op = cpu_op_ ? *cpu_op_ : op;
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
      run_on_caller(op, stack, device, /*synchronize=*/false);
    } else if (c.sync || !info_.tensor_returns_only || !enqueue(op, stack, device)) {
      run_on_caller(op, stack, device, /*synchronize=*/true);
    }
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

  // What the kernel needs to know about the operator's schema, computed once.
  struct SchemaInfo {
    std::vector<std::optional<size_t>> return_alias;  // per result: the argument it writes
    std::vector<bool> write_argument;                 // per argument: written (out=, in-place)
    std::vector<bool> out_argument;                   // per argument: an out= tensor
    bool tensor_returns_only = true;                  // results are tensors or tensor lists
    bool has_write_arguments = false;
    bool has_generator = false;
    bool has_index_list = false;    // a Tensor?[] argument (indices)
    bool zero_tensor_args = false;  // ATen passes efficient zero tensors through (dot, vdot)
    SerialRule serial;              // which calls run without intra-op parallelism
  };

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
      info_.serial = {serial_numel(config_->name), matmul_left_operand(config_->name)};
      cpu_op_ = find_op(config_->cpu_op);
      out_op_ = find_op(config_->out_variant);
      functional_op_ = find_op(config_->functional);
      key_options_.list_values = !foreach_;
      key_options_.float_values = !foreach_;  // _foreach_ scalars change every step
      key_options_.aliasing = info_.has_write_arguments && !foreach_;
    });
  }

  static std::optional<c10::OperatorHandle> find_op(const char* full) {
    if (full == nullptr || *full == '\0') return std::nullopt;
    const std::string name(full);  // "aten::add.out"
    const size_t dot = name.find('.');
    return c10::Dispatcher::singleton().findSchemaOrThrow(
        name.substr(0, dot).c_str(), dot == std::string::npos ? "" : name.c_str() + dot + 1);
  }

  // The result metadata, the allocation of results and the task. False if the call must run
  // synchronously instead (no meta kernel, a CPU tensor with elements among the arguments, a
  // kernel the meta functions do not describe).
  bool enqueue(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device) {
    const c10::FunctionSchema& schema = op.schema();
    const size_t n = schema.arguments().size();
    const size_t begin = stack->size() - n;
    if (unconvertible_scalar(*stack, begin)) return false;

    thread_local std::string key;  // reused: no allocation per call
    key.clear();
    KeyOptions options = key_options_;
    // Float values stay in the key of arange (they decide its shape) and of random operators
    // (their checks read them: uniform_'s range; their values rarely change per step).
    const bool keep_floats = float_shapes_ || info_.has_generator;
    options.float_values = options.float_values && (keep_floats || !floats_vary_.varies());
    bool has_floats = false;
    const bool cacheable = encode_call(*stack, begin, options, key, &has_floats);
    std::shared_ptr<const CachedResult> shapes = cacheable ? cache_.find(key) : nullptr;
    if (!shapes && cacheable && has_floats && options.float_values && !keep_floats) {
      // A miss keyed on float values: where they keep changing (a learning rate), key calls
      // on their types instead, so they stay asynchronous.
      thread_local std::string type_key;
      type_key.clear();
      KeyOptions by_type = options;
      by_type.float_values = false;
      encode_call(*stack, begin, by_type, type_key);
      if (floats_vary_.varies(type_key, key)) {
        key = type_key;
        shapes = cache_.find(key);
      }
    }
    const bool miss = shapes == nullptr;
    if (miss) {
      const std::string miss_key = key;  // the meta pass below may run operators on this thread
      std::shared_ptr<CachedResult> computed =
          meta_results(cpu_op_ ? *cpu_op_ : op, config_->meta, *stack, begin);
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
      if (!capturing(device)) {
        // The first call of a signature runs on the caller: its errors are raised here, at the
        // call, like CUDA's argument checks, and its actual results are what later calls
        // allocate (meta functions do not always describe what the CPU kernel returns: batch
        // norm's statistics in eval mode, strides). A call that raises is not cached, and
        // leaves its out= tensors as they were (the CPU kernel checks before it resizes).
        const std::vector<std::optional<Layout>> before = written_layouts(*stack, begin);
        // Empty out= tensors get their size here where a C++ meta function (the one the CPU
        // kernel runs) gave it; others are for the CPU kernel to judge (it resizes only where
        // the element count differs: logspace into a [2, 2] view keeps it). Python meta
        // functions can disagree with the CPU kernel (batch norm's statistics in eval mode).
        if (config_->meta != nullptr) resize_written(*computed, *stack, begin, /*only_empty=*/true);
        std::shared_ptr<CachedResult> seen;
        try {
          seen = run_on_caller(op, stack, device, true, computed.get());
        } catch (...) {
          restore_written(before, *stack, begin);
          throw;
        }
        if (cacheable) cache_.insert(miss_key, std::move(seen));
        return true;
      }
      resize_written(*computed, *stack, begin);
      // During graph capture nothing may synchronize: trust the meta functions.
      if (cacheable) cache_.insert(miss_key, computed);
      shapes = std::move(computed);
    } else {
      if (shapes->run_on_caller) return false;
      resize_written(*shapes, *stack, begin);
    }

    // Results: arguments written in place (out=, in-place) or new tensors.
    const size_t n_returns = info_.return_alias.size();
    c10::SmallVector<c10::IValue, 3> results(n_returns);
    c10::SmallVector<Layout, 3> fresh;  // new results, in order
    for (size_t j = 0; j < n_returns; ++j) {
      if (const auto arg = info_.return_alias[j]) {
        results[j] = (*stack)[begin + *arg];
        continue;
      }
      if (!shapes->result_is_list[j]) {
        at::Tensor t = allocate(shapes->results[j].front());
        fresh.push_back(Layout::of(t));
        results[j] = std::move(t);
      } else {
        std::vector<at::Tensor> ts;
        for (const TensorMeta& m : shapes->results[j]) {
          ts.push_back(allocate(m));
          fresh.push_back(Layout::of(ts.back()));
        }
        results[j] = std::move(ts);
      }
    }

    Work work{cpu_op_ ? *cpu_op_ : op,
              std::unique_ptr<WorkBuffers, RecycleBuffers>(take_buffers().release())};
    WorkBuffers& buf = *work.buf;
    materialize_written(*stack, begin);
    if (functional_op_) {
      // An out= form with several outputs: run the functional form and copy into the outputs
      // (see codegen/gen_accel.py for why it is not called boxed).
      work.op = *functional_op_;
      for (size_t i = 0; i < n; ++i) {
        if (!info_.out_argument[i]) buf.add().stash((*stack)[begin + i], info_.write_argument[i]);
      }
      for (const std::optional<size_t>& arg : info_.return_alias) {
        buf.copy_into.push_back(Layout::of((*stack)[begin + *arg].toTensor()));
      }
    } else {
      for (size_t i = begin; i < stack->size(); ++i) {
        buf.add().stash((*stack)[i], info_.write_argument[i - begin]);
      }
    }
    if (!fresh.empty()) {
      // `into` functions call the CPU's kernels: the host executor's alone.
      if (config_->into != nullptr && executor() == Executor::Host) {
        work.into = config_->into;  // computes straight into the new tensors
        buf.copy_into.assign(fresh.begin(), fresh.end());
      } else if (out_op_ && !cpu_op_) {
        work.op = *out_op_;  // results are written straight into the new tensors
        for (const Layout& l : fresh) {
          Arg& a = buf.add();
          a.kind = Arg::Kind::Tensor;
          a.result = true;
          a.tensor = l;
        }
      } else {
        buf.copy_into.assign(fresh.begin(), fresh.end());
      }
    }
    work.serial = small_work(buf, info_.serial);
    std::optional<rt::Task> direct;
    if (executor() == Executor::Host && capturing(device) && stream_capturing(device)) {
      direct = replay_elementwise(work);
    }
    if (direct) {
      launch(device, config_->name, std::move(*direct));  // replays without ATen
    } else {
      launch_kernel(device, config_->name, std::move(work));
    }

    torch::jit::drop(*stack, n);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return true;
  }

  // out= arguments the meta pass resized get the same shape on accel. Tensors written in place
  // never change shape (some Python meta functions resize them, atan2_'s: the CPU kernel then
  // refuses the call, on the caller).
  void resize_written(const CachedResult& shapes, const torch::jit::Stack& stack, size_t begin,
                      bool only_empty = false) const {
    for (size_t i = 0; i < info_.write_argument.size(); ++i) {
      if (!info_.out_argument[i] || !shapes.written[i]) continue;
      const at::Tensor& t = stack[begin + i].toTensor();
      // Before the first call runs, only the empty out= tensors the kernel would resize: one
      // of the right shape already keeps its strides (resize_output leaves it alone).
      if (only_empty && (t.numel() != 0 || t.sizes().equals(shapes.written[i]->sizes))) continue;
      adopt_layout(t, *shapes.written[i]);
    }
  }

  // Written copy-on-write tensors get their own memory before any argument is described: a
  // tensor read in the same call through a shared storage then sees that memory too.
  void materialize_written(const torch::jit::Stack& stack, size_t begin) const {
    for (size_t i = 0; i < info_.write_argument.size(); ++i) {
      const c10::IValue& v = stack[begin + i];
      if (!info_.write_argument[i]) continue;
      if (v.isTensor() && v.toTensor().defined()) {
        (void)v.toTensor().storage().mutable_data();
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) (void)t.storage().mutable_data();
      }
    }
  }

  // The layouts of the written accel tensors, before a call that may resize them.
  std::vector<std::optional<Layout>> written_layouts(const torch::jit::Stack& stack,
                                                     size_t begin) const {
    std::vector<std::optional<Layout>> layouts(info_.write_argument.size());
    for (size_t i = 0; i < layouts.size(); ++i) {
      if (!info_.write_argument[i] || !stack[begin + i].isTensor()) continue;
      const at::Tensor& t = stack[begin + i].toTensor();
      if (is_accel(t)) layouts[i] = Layout::of(t);
    }
    return layouts;
  }

  // Gives written tensors back the sizes, strides and offset they had (storage that grew stays
  // grown: its first bytes are the old contents).
  void restore_written(const std::vector<std::optional<Layout>>& layouts,
                       const torch::jit::Stack& stack, size_t begin) const {
    for (size_t i = 0; i < layouts.size() && begin + i < stack.size(); ++i) {
      if (!layouts[i] || !stack[begin + i].isTensor()) continue;
      const at::Tensor& t = stack[begin + i].toTensor();
      t.unsafeGetTensorImpl()->set_sizes_and_strides(layouts[i]->sizes, layouts[i]->strides,
                                                     layouts[i]->offset);
    }
  }

  static bool capturing(c10::DeviceIndex device) {
    return device::call([&] { return rt::device_is_capturing(device); });
  }
  static bool stream_capturing(c10::DeviceIndex device) {
    return device::call([&] { return rt::stream_capture_id(rt::current_stream(device)) != 0; });
  }

  // Runs the CPU kernel on the calling thread on CPU views of the accel memory (no copy of the
  // arguments; new results are copied to accel), after the stream has drained: for results
  // whose shapes depend on the data, non-tensor results, calls the meta pass cannot represent,
  // and the first call of each signature. Operators that read no tensor data (metadata_only)
  // do not wait. Returns the metadata of the results and of the written arguments afterwards.
  // `expected`: the results the meta pass computed, where known (they decide, with the
  // arguments, whether the kernel runs serially, as the task of a later call would).
  std::shared_ptr<CachedResult> run_on_caller(const c10::OperatorHandle& op,
                                              torch::jit::Stack* stack, c10::DeviceIndex device,
                                              bool synchronize,
                                              const CachedResult* expected = nullptr) {
    const size_t n = op.schema().arguments().size();
    const size_t begin = stack->size() - n;
    // The host's CPU kernel reads the memory now: the stream drains first. CUDA's kernel runs in
    // the accel stream's order (one that needs its result shape synchronizes that stream).
    // Either way such a call waits for its data on the host: never during a capture.
    const bool host = executor() == Executor::Host;
    if (synchronize) {
      refuse_capture(device, config_->name,
                     "it runs on the calling thread once the stream has drained (its result "
                     "shape depends on the data, or it returns a value to the host)");
      // The first call of a signature (expected: its meta results) is accel's warm-up, not
      // the operator's wait: it does not report. CUDA's kernels run without waiting where
      // only the host's need the stream drained (no meta function for the results).
      if (expected == nullptr && (config_->sync || !info_.tensor_returns_only || host)) {
        warn_or_error_on_sync(config_->name,
                              config_->sync ? "its result shape depends on the data"
                              : !info_.tensor_returns_only
                                  ? "it returns a value to the host"
                                  : "accel cannot know its results before it runs: their "
                                    "shape depends on the data, or no meta function describes "
                                    "them for these arguments");
      }
      if (host) {
        device::call([&] { rt::stream_synchronize(rt::current_stream(device)); }, config_->name);
      }
    }
    KernelScope scope(device);
    KernelStorages storages(kernel_device(device));
    std::vector<std::unique_ptr<rt::HostAccessGuard>> access;
    c10::SmallVector<const void*, 8> accessed;
    std::vector<at::Tensor> written_views(n);  // the CPU views of written accel tensors
    materialize_written(*stack, begin);
    bool write = false;  // whether the argument being viewed is written
    const auto view = [&](const at::Tensor& t) {
      const Layout l = Layout::of(t, write);
      if (host && std::find(accessed.begin(), accessed.end(), l.base) == accessed.end()) {
        accessed.push_back(l.base);
        access.push_back(std::make_unique<rt::HostAccessGuard>(l.base, l.nbytes));
      }
      at::Tensor v = l.view(storages);
      // Operators that only inspect their arguments may look at requires_grad too (the
      // attention backend choice does).
      if (config_->metadata_only && t.requires_grad()) v.set_requires_grad(true);
      return v;
    };
    torch::jit::Stack cpu;
    cpu.reserve(n);
    for (size_t i = begin; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      write = info_.write_argument[i - begin];
      if (v.isTensor() && is_accel(v.toTensor())) {
        cpu.emplace_back(view(v.toTensor()));
        if (info_.write_argument[i - begin]) written_views[i - begin] = cpu.back().toTensor();
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> ts;
        for (const at::Tensor& t : v.toTensorVector()) ts.push_back(is_accel(t) ? view(t) : t);
        cpu.emplace_back(std::move(ts));
      } else if (is_optional_tensor_list(v)) {
        c10::List<std::optional<at::Tensor>> ts;
        for (const c10::IValue& e : v.toListRef()) {
          if (e.isNone()) {
            ts.push_back(std::nullopt);
          } else {
            const at::Tensor& t = e.toTensor();
            ts.push_back(is_accel(t) ? view(t) : t);
          }
        }
        cpu.emplace_back(std::move(ts));
      } else if (v.isDevice() && v.toDevice().type() == kAccel) {
        cpu.emplace_back(kernel_device(v.toDevice().index()));
      } else {
        cpu.push_back(v);
      }
    }
    // Warnings pass on to the caller's handler (Python's); a signature whose kernel warns keeps
    // running here, so that each call warns at the call, as on the CPU.
    struct SeeWarnings final : c10::WarningHandler {
      explicit SeeWarnings(c10::WarningHandler* next) : next(next) {}
      void process(const c10::Warning& w) override {
        seen = true;
        next->process(w);
      }
      c10::WarningHandler* next;
      bool seen = false;
    } warnings(c10::WarningUtils::get_warning_handler());
    {
      const bool serial = host && small_call(*stack, begin, expected, info_.serial);
      const c10::OperatorHandle& kernel = cpu_op_ ? *cpu_op_ : op;
      const auto call = [&] {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        std::optional<SerialScope> one_thread;
        if (serial) one_thread.emplace();
        kernel.callBoxed(&cpu);
      };
      c10::WarningUtils::WarningHandlerGuard see(&warnings);
      if (host && synchronize) {
        // On the stream's worker, as tasks run (see run_on_stream), not as an operator of its
        // own in a profile (as Work::run).
        run_on_stream(device, config_->name, [&] {
          at::DisableRecordFunctionGuard not_an_operator;
          call();
        });
      } else {
        call();
      }
    }

    auto seen = std::make_shared<CachedResult>();
    seen->run_on_caller = warnings.seen;
    seen->written.assign(n, std::nullopt);
    // Written tensors the kernel resized (an out= tensor the meta functions sized otherwise, or
    // not at all) take the new layout on accel; moved ones (grown past their storage into CPU
    // memory) are copied back.
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& v = written_views[i];
      if (!v.defined()) continue;
      const at::Tensor& t = (*stack)[begin + i].toTensor();
      const Layout before = Layout::of(t);
      if (before.changed_in(v)) {
        // The task could not apply this: keep calls synchronous. An empty out= tensor the
        // kernel sized is sized before the task of later calls (seen->written) instead.
        if (t.numel() != 0 || !info_.out_argument[i]) seen->run_on_caller = true;
        if (v.storage().data() == before.base) {
          t.unsafeGetTensorImpl()->set_sizes_and_strides(v.sizes(), v.strides(),
                                                         v.storage_offset());
        } else {
          const at::Tensor dense = v.is_non_overlapping_and_dense() ? v : v.contiguous();
          t.unsafeGetTensorImpl()->set_storage_offset(0);
          adopt_layout(t, TensorMeta::of(dense));
          if (dense.is_cpu()) {
            t.copy_(dense);
          } else {
            write_result(t, dense, config_->name);
          }
        }
      }
      seen->written[i] = TensorMeta::of(t);
    }
    // The results: a written argument's accel tensor itself (its view was written in place),
    // else accel copies of the CPU results.
    c10::SmallVector<c10::IValue, 3> results;
    for (size_t j = 0; j < cpu.size(); ++j) {
      const std::optional<size_t> alias =
          j < info_.return_alias.size() ? info_.return_alias[j] : std::nullopt;
      const c10::IValue& r = cpu[j];
      if (alias) {
        results.push_back((*stack)[begin + *alias]);
        seen->results.push_back({TensorMeta::of(results.back().toTensor())});
        seen->result_is_list.push_back(false);
      } else if (r.isTensor()) {
        const at::Tensor& t = r.toTensor();
        results.emplace_back(to_accel(
            config_->contiguous_results && t.defined() ? t.contiguous() : t, config_->name));
        seen->results.push_back({TensorMeta::of(results.back().toTensor())});
        seen->result_is_list.push_back(false);
      } else if (r.isTensorList()) {
        std::vector<at::Tensor> ts;
        std::vector<TensorMeta> ms;
        for (const at::Tensor& t : r.toTensorVector()) {
          ts.push_back(to_accel(t, config_->name));
          ms.push_back(TensorMeta::of(ts.back()));
        }
        seen->results.push_back(std::move(ms));
        seen->result_is_list.push_back(true);
        results.emplace_back(std::move(ts));
      } else {
        results.push_back(r);
      }
    }
    access.clear();
    torch::jit::drop(*stack, n);
    for (c10::IValue& r : results) stack->push_back(std::move(r));
    return seen;
  }

  const OpConfig* config_;
  const c10::KernelFunction native_;  // where the operator is native (see make_kernel)
  const bool foreach_;
  const bool float_shapes_;  // floating-point arguments decide result shapes (arange)
  SchemaInfo info_;          // set by resolve_ops
  KeyOptions key_options_;   // set by resolve_ops
  FloatVariation floats_vary_;
  MetaCache cache_;
  std::once_flag resolved_;
  std::optional<c10::OperatorHandle> cpu_op_;
  std::optional<c10::OperatorHandle> out_op_;
  std::optional<c10::OperatorHandle> functional_op_;
};

}  // namespace

torch::CppFunction make_kernel(const OpConfig& config, c10::KernelFunction native) {
  return torch::CppFunction::makeFromBoxedFunctor(
      std::make_unique<UnderlyingKernel>(&config, std::move(native)));
}

void set_force_fallback(bool force) {
  g_force_fallback.store(force);
}
bool force_fallback() {
  return g_force_fallback.load();
}

}  // namespace accel::aten
