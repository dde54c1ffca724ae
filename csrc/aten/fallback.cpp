// The boxed CPU fallback for PrivateUse1, and clear errors for quantized accel tensors.
//
// On top of at::native::cpu_fallback (inputs to the CPU, the CPU kernel, results and mutated
// inputs back), this fallback:
//  - follows ACCEL_FALLBACK: warns once per operator, stays silent, or refuses;
//  - counts calls per operator (torch.accel.fallback_stats());
//  - refuses operators whose fallback would be wrong (a short deny list, with the reason);
//  - refuses tensors of two accel devices in one call, like CUDA;
//  - gives random operators a CPU generator drawn from the accel generator, so
//    torch.accel.manual_seed makes them reproducible;
//  - returns real views for operators that return views: the view is computed on meta tensors
//    and applied to the accel storage (a copy would silently break aliasing).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/to.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/direct_call.h"
#include "aten/dispatch_util.h"
#include "aten/executor.h"
#include "aten/fallback.h"
#include "aten/host_task.h"
#include "aten/underlying.h"
#include "device/common.h"
#include "device/generator.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace accel::aten {
namespace {

using device::kAccel;

std::atomic<int> g_mode{-1};  // -1: not read from the environment yet
std::mutex g_stats_mutex;
std::unordered_map<std::string, int64_t> g_counts;
std::unordered_set<std::string> g_warned;

// Why an operator must not take the copying fallback ("" if it may).
std::string denied(const std::string& name) {
  static const std::unordered_map<std::string, const char*> kExact = {
      // Structural operators are native; the fallback would recurse into them or lose aliasing.
      {"aten::_copy_from", "it moves data between devices and must be native"},
      {"aten::_copy_from_and_resize", "it moves data between devices and must be native"},
      {"aten::copy_", "it moves data between devices and must be native"},
      {"aten::empty.memory_format", "it allocates accel memory and must be native"},
      {"aten::empty_strided", "it allocates accel memory and must be native"},
      {"aten::resize_", "it changes the storage and must be native"},
      {"aten::_local_scalar_dense", "it reads device memory and must be native"},
      // Stream bookkeeping is meaningless on a CPU copy.
      {"aten::record_stream", "it records a stream use of device memory and must be native"},
  };
  if (auto it = kExact.find(name); it != kExact.end()) return it->second;
  static const std::pair<const char*, const char*> kPrefixes[] = {
      {"aten::set_", "it changes the storage and must be native"},
      {"aten::to_mkldnn", "it produces mkldnn tensors, which accel does not support"},
      {"aten::quantize_per", "it produces quantized tensors, which accel does not support"},
      {"aten::_make_per_", "it produces quantized tensors, which accel does not support"},
  };
  for (const auto& [prefix, why] : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return why;
  }
  return {};
}

// A meta tensor with the same storage extent, offset, sizes, strides, dtype and bits.
at::Tensor to_meta(const at::Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.itemsize());
  const int64_t elems = (static_cast<int64_t>(t.storage().nbytes()) + item - 1) / item;
  at::Tensor base =
      at::empty({elems}, at::TensorOptions().dtype(t.scalar_type()).device(c10::kMeta));
  at::Tensor v = base.as_strided(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) v._set_conj(true);
  if (t.is_neg()) v._set_neg(true);
  return v;
}

// An accel tensor over `base`'s storage with the layout the meta computation produced.
at::Tensor alias_of(const at::Tensor& base, const at::Tensor& meta) {
  // The base's keys (autograd included, so autograd can track the view), without its
  // conjugate/negative bits: the result's own bits are set below.
  const c10::DispatchKeySet keys =
      base.key_set() -
      c10::DispatchKeySet({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::TensorImpl::VIEW, c10::Storage(base.storage()), keys, meta.dtype());
  impl->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  at::Tensor out(std::move(impl));
  if (meta.is_conj()) out._set_conj(true);
  if (meta.is_neg()) out._set_neg(true);
  return out;
}

void view_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   const std::string& name) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  torch::jit::Stack meta_stack;
  std::vector<at::Tensor> bases(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[begin + i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kAccel) {
      bases[i] = v.toTensor();
      meta_stack.emplace_back(to_meta(bases[i]));
    } else if (v.isDevice() && v.toDevice().type() == kAccel) {
      meta_stack.emplace_back(c10::Device(c10::kMeta));
    } else {
      TORCH_CHECK_NOT_IMPLEMENTED(!v.isTensorList(), name,
                                  " returns a view of a tensor list, which the accel fallback "
                                  "cannot alias; it needs an accel kernel");
      meta_stack.push_back(v);
    }
  }
  // The meta kernel checks the arguments as the CPU's does: its errors are the call's (unfold
  // past the end raises as on the CPU). One it lacks is accel's.
  try {
    op.callBoxed(&meta_stack);
  } catch (const c10::NotImplementedError& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, name,
                                " returns a view and has no accel kernel; computing the view "
                                "on meta tensors failed: ",
                                e.what_without_backtrace());
  }
  torch::jit::drop(*stack, n);
  const auto& returns = schema.returns();
  for (size_t j = 0; j < returns.size(); ++j) {
    const c10::AliasInfo* alias = returns[j].alias_info();
    TORCH_CHECK_NOT_IMPLEMENTED(alias != nullptr && !alias->isWrite(), name,
                                " mixes views and new tensors in its results; the accel "
                                "fallback cannot run it");
    // The argument this result aliases.
    const at::Tensor* base = nullptr;
    for (size_t i = 0; i < n && base == nullptr; ++i) {
      const c10::AliasInfo* a = schema.arguments()[i].alias_info();
      if (a == nullptr || !bases[i].defined()) continue;
      for (const auto& set : alias->beforeSets()) {
        if (a->beforeSets().count(set) != 0) base = &bases[i];
      }
    }
    TORCH_CHECK_NOT_IMPLEMENTED(base != nullptr, name,
                                ": cannot tell which accel argument its view aliases");
    const c10::IValue& result = meta_stack[j];
    if (result.isTensor()) {
      stack->emplace_back(alias_of(*base, result.toTensor()));
    } else {
      std::vector<at::Tensor> views;
      for (const at::Tensor& m : result.toTensorVector()) views.push_back(alias_of(*base, m));
      stack->emplace_back(std::move(views));
    }
  }
}

void count_and_warn(const std::string& name, FallbackMode mode) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_stats_mutex);
    ++g_counts[name];
    if (mode == FallbackMode::Warn) first = g_warned.insert(name).second;
  }
  if (first) {
    TORCH_WARN(name,
               " has no accel kernel and runs on the CPU fallback: its inputs are copied to the "
               "CPU and its results back, which is slow. torch.accel.fallback_stats() lists such "
               "calls; ACCEL_FALLBACK=silent hides this warning, ACCEL_FALLBACK=error forbids "
               "the fallback.");
  }
}

// Runs the operator on the CPU with copies of its accel arguments, then counts the call: calls
// that raise (a user error the CPU kernel reports) are not counted.
void copying_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                      const std::string& name, FallbackMode mode) {
  const c10::DeviceIndex dev = call_device(op, *stack, name);
  c10::DeviceGuard guard(c10::Device(kAccel, dev));
  // Random operators draw from the accel generator through a CPU generator derived from it.
  substitute_generators(op, stack, dev);
  at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
  // cpu_fallback puts new results on the device of the first tensor argument, which is the
  // CPU for a Python scalar first (5 // x): results belong on the accel device.
  const c10::Device target(kAccel, dev);
  const size_t n_returns = op.schema().returns().size();
  for (size_t i = stack->size() - n_returns; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (r.isTensor() && r.toTensor().defined() && r.toTensor().device().is_cpu()) {
      r = r.toTensor().to(target);
    } else if (r.isTensorList()) {
      std::vector<at::Tensor> ts = r.toTensorVector();
      bool moved = false;
      for (at::Tensor& t : ts) {
        if (t.defined() && t.device().is_cpu()) {
          t = t.to(target);
          moved = true;
        }
      }
      if (moved) r = std::move(ts);
    }
  }
  count_and_warn(name, mode);
}

// The executor device's dispatch key (CPU on the host driver, CUDA on cuda), if it has one.
std::optional<c10::DispatchKey> executor_key() {
  switch (executor()) {
    case Executor::Host: return c10::DispatchKey::CPU;
    case Executor::Cuda: return c10::DispatchKey::CUDA;
    default: return std::nullopt;
  }
}

// Another library's operator with a kernel for the executor's device (torchvision::nms): it
// runs on accel memory without copies, as the underlying tier runs ATen's. Not a fallback.
void library_executor_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                           const std::string& name) {
  const c10::DeviceIndex dev = call_device(op, *stack, name);
  c10::DeviceGuard guard(c10::Device(kAccel, dev));
  const auto draws = substitute_kernel_generators(op, stack, dev);  // cuda: after the call
  direct_call(op, stack);
}

void accel_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = op_name(op);
  if (name.rfind("aten::_nested", 0) == 0 || name.rfind("aten::_to_sparse", 0) == 0) {
    // Operators that make or inspect nested tensors from dense ones, or make sparse ones
    // (direct_call.cpp).
    direct_call(op, stack);
    return;
  }
  const auto key = executor_key();
  if (name.rfind("aten::", 0) != 0 && key && !force_fallback() &&
      op.hasKernelForDispatchKey(*key)) {
    library_executor_call(op, stack, name);
    return;
  }
  const std::string why = denied(name);
  TORCH_CHECK_NOT_IMPLEMENTED(why.empty(), name,
                              " cannot run on accel through the CPU fallback: ", why);
  if (returns_view(op.schema())) {
    // Not a fallback: the view is computed from metadata and aliases the accel storage.
    const c10::DeviceIndex dev = call_device(op, *stack, name);
    c10::DeviceGuard guard(c10::Device(kAccel, dev));
    view_fallback(op, stack, name);
    return;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU), name,
                              " has no accel kernel, and no CPU kernel to fall back to (PyTorch "
                              "implements it for other devices only)");
  const FallbackMode mode = fallback_mode();
  TORCH_CHECK_NOT_IMPLEMENTED(mode != FallbackMode::Error, name,
                              " has no accel kernel, and ACCEL_FALLBACK=error forbids running it "
                              "on the CPU fallback. Set ACCEL_FALLBACK=warn (the default) or "
                              "silent to allow the fallback.");
  check_cpu_kernel_inputs(op, *stack);
  refuse_capture(call_device(op, *stack, name), name.c_str(),
                 "it has no accel kernel and runs through the CPU fallback, which copies its "
                 "arguments to the host");
  warn_or_error_on_sync(name.c_str(), "it has no accel kernel and runs through the CPU fallback");
  const QuietSyncs quiet;  // reported once: not each copy it makes
  copying_fallback(op, stack, name, mode);
}

// The accel kernel prefer_executor_kernels registers: the executor device's kernel on accel
// memory; the copying fallback where the tests force it; else (a driver without an executor, or
// an operator without a kernel for it) the CompositeExplicitAutograd kernel accel took before,
// reached through PrivateUse3, a backend key nobody registers for, whose table entry holds it
// (prefer_executor_kernels skips operators with a PrivateUse3 kernel of their own).
void executor_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (force_fallback()) {
    accel_fallback(op, stack);
    return;
  }
  const auto key = executor_key();
  if (key && op.hasKernelForDispatchKey(*key)) {
    library_executor_call(op, stack, op_name(op));
    return;
  }
  // (redispatchBoxed reads the computed dispatch table; callBoxedForDispatchKey would look for
  // a kernel or backend fallback registered for PrivateUse3 itself, and finds none.)
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
}

void unsupported_fallback(const char* what, const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, op_name(op), ": ", what,
      " are not supported on accel (accel has dense, nested and sparse tensors)");
}

void quantized_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  unsupported_fallback("quantized tensors", op, stack);
}

FallbackMode mode_from_env() {
  const char* v = std::getenv("ACCEL_FALLBACK");
  FallbackMode mode = FallbackMode::Warn;
  if (v != nullptr && *v != '\0' && !parse_fallback_mode(v, &mode)) {
    TORCH_WARN("ACCEL_FALLBACK='", v, "' is not one of warn, silent, error; using warn");
  }
  return mode;
}

}  // namespace

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  accel_fallback(op, stack);
}

bool parse_fallback_mode(const std::string& text, FallbackMode* mode) {
  if (text == "warn") {
    *mode = FallbackMode::Warn;
  } else if (text == "silent") {
    *mode = FallbackMode::Silent;
  } else if (text == "error") {
    *mode = FallbackMode::Error;
  } else {
    return false;
  }
  return true;
}

const char* fallback_mode_name(FallbackMode mode) {
  switch (mode) {
    case FallbackMode::Warn: return "warn";
    case FallbackMode::Silent: return "silent";
    case FallbackMode::Error: return "error";
  }
  return "warn";
}

FallbackMode fallback_mode() {
  int m = g_mode.load(std::memory_order_acquire);
  if (m < 0) {
    int expected = -1;
    g_mode.compare_exchange_strong(expected, static_cast<int>(mode_from_env()));
    m = g_mode.load(std::memory_order_acquire);
  }
  return static_cast<FallbackMode>(m);
}

void set_fallback_mode(FallbackMode mode) {
  g_mode.store(static_cast<int>(mode), std::memory_order_release);
}

std::vector<std::pair<std::string, int64_t>> fallback_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  std::map<std::string, int64_t> sorted(g_counts.begin(), g_counts.end());
  return {sorted.begin(), sorted.end()};
}

void reset_fallback_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_counts.clear();
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&accel_fallback>());
}
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

std::vector<std::string> prefer_executor_kernels(const std::string& ns) {
  // Decides nothing about the driver (the runtime stays uninitialized until accel is used:
  // torchaudio's import must not start it); executor_kernel picks at each call.
  std::vector<std::string> registered;
  if (ns.empty() || ns == "aten" || ns == "accel") return registered;
  // One IMPL block per namespace and call, alive for the process: a Library deregisters its
  // kernels when destroyed, and static destruction order at exit is not ours to choose.
  static std::mutex mutex;
  static auto* libraries = new std::vector<std::unique_ptr<torch::Library>>();
  std::lock_guard<std::mutex> lock(mutex);
  torch::Library* library = nullptr;
  const std::string prefix = ns + "::";
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind(prefix, 0) != 0) continue;
    const auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasSchema() ||
        !(op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse3)) {
      continue;
    }
    if (library == nullptr) {
      libraries->push_back(std::make_unique<torch::Library>(
          torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
      library = libraries->back().get();
    }
    const std::string overload = name.overload_name.empty() ? "" : "." + name.overload_name;
    const std::string qualified = name.name.substr(prefix.size()) + overload;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&executor_kernel>());
    registered.push_back(name.name + overload);
  }
  return registered;
}

void host_round_trip(const std::string& name, c10::DeviceIndex device) {
  const FallbackMode mode = fallback_mode();
  TORCH_CHECK_NOT_IMPLEMENTED(mode != FallbackMode::Error, name, " has no accel kernel on the ",
                              rt::driver_name(),
                              " driver, and ACCEL_FALLBACK=error forbids copying through the "
                              "host. Set ACCEL_FALLBACK=warn (the default) or silent to allow it.");
  const char* why = "it has no accel kernel on this driver and copies through the host";
  refuse_capture(device, name.c_str(), why);
  warn_or_error_on_sync(name.c_str(), why);
  count_and_warn(name, mode);
}

}  // namespace accel::aten
