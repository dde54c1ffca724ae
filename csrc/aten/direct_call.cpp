// Kernels of the executor's device (executor.h: the CPU's on the host driver, CUDA's on cuda) run
// on accel memory on the calling thread: no copy of the inputs, new results copied to accel,
// results over an argument's memory aliasing it. The underlying tier runs most operators from
// their result metadata, in stream order; this path is for calls whose results cannot be known
// in advance:
//
// - Operators of other libraries with a CPU kernel (torchvision::nms, roi_align, custom ops):
//   they have no accel registration, so the fallback brings them here instead of copying (on
//   cuda, where they have a CUDA kernel).
// - Nested tensors (torch.nested with the strided layout, and nn.Transformer's fast path,
//   which PyTorch takes for PrivateUse1 in eval mode).
// - Sparse tensors (sparse.h): the executor device's sparse tensor over the same indices and
//   values; a kernel that changes a sparse argument in place (resizing it, replacing its
//   members) has its result written back into the accel tensor.
//
// A nested accel tensor is ATen's NestedTensorImpl over an accel buffer, with its metadata
// (sizes, strides, offsets) in CPU tensors as on every device. Operators on it dispatch to the
// NestedTensorPrivateUse1 key; ATen has kernels for NestedTensorCPU and NestedTensorCUDA only. The
// kernel below runs the executor device's kernel on nested tensors of that device over the same
// memory (no copy of the inputs): on the host after the stream has drained (nested kernels read
// their metadata and often the data on the host, so they run on the caller), on cuda in accel
// stream order. New results are copied to accel; results over an argument's memory alias it.
//
// The same path runs the dense-input operators that make nested tensors (_nested_tensor_from_mask
// and the other aten::_nested* operators, through the fallback).
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "aten/direct_call.h"
#include "aten/dispatch_util.h"
#include "aten/executor.h"
#include "aten/host_task.h"
#include "aten/results.h"
#include "aten/sparse.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

// Accel storages by base address (the address their CPU views have on the host driver).
struct AccelMemory {
  std::vector<std::pair<const void*, c10::Storage>> storages;

  void add(const c10::Storage& s) {
    const void* base = s.data();
    if (base == nullptr) return;
    for (const auto& entry : storages) {
      if (entry.first == base) return;
    }
    storages.emplace_back(base, s);
  }
  std::optional<c10::Storage> find(const void* base) const {
    if (base == nullptr) return std::nullopt;
    for (const auto& [b, s] : storages) {
      if (b == base) return s;
    }
    return std::nullopt;
  }
};

// A contiguous 1-d tensor over all of `storage` (a nested tensor's buffer).
at::Tensor whole_buffer(c10::Storage storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype) {
  const int64_t n = static_cast<int64_t>(storage.nbytes() / dtype.itemsize());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, dtype);
  impl->set_sizes_contiguous({n});
  return at::Tensor(std::move(impl));
}

at::Tensor nested_over(const at::Tensor& buffer, const at::native::NestedTensorImpl& like) {
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, like.get_nested_sizes(), like.get_nested_strides(), like.get_storage_offsets());
}

class Converter {
 public:
  explicit Converter(c10::DeviceIndex device)
      : device_(device), storages_(kernel_device(device)), host_(executor() == Executor::Host) {}

  // The tensor of the executor's device over the memory of an accel argument (dense, nested or
  // sparse). Memory the kernel only reads stays shared where it is copy-on-write.
  at::Tensor to_cpu(const at::Tensor& t, bool write) {
    if (!is_accel(t)) return t;
    if (is_sparse_any(t)) {
      at::Tensor mine = sparse_on(t, storages_.device(),
                                  [this, write](const at::Tensor& d) { return to_cpu(d, write); });
      sparse_.emplace_back(mine.unsafeGetTensorImpl(), t);
      return mine;
    }
    const c10::Storage& s = t.storage();
    memory_.add(s);
    bases_.emplace_back(s.data(), t);
    guard(s);
    if (!t.is_nested()) return Layout::of(t, write).view(storages_);
    const auto* nt = at::native::get_nested_tensor_impl(t);
    c10::Storage cpu =
        storages_.get(write ? s.mutable_data() : const_cast<void*>(s.data()), s.nbytes());
    const c10::DispatchKey key =
        c10::computeDispatchKey(t.scalar_type(), c10::kStrided, storages_.device());
    return nested_over(whole_buffer(std::move(cpu), c10::DispatchKeySet(key), t.dtype()), *nt);
  }

  // The accel tensor for a result of the kernel: an alias where it lies in an argument's memory,
  // else a copy on the call's device.
  at::Tensor to_accel(const at::Tensor& r, const char* what) {
    if (!r.defined() || r.device().type() != storages_.device().type()) return r;
    if (is_sparse_any(r)) {
      for (const auto& [impl, argument] : sparse_) {
        if (impl == r.unsafeGetTensorImpl()) return argument;  // the argument itself
      }
      return sparse_on(r, c10::Device(kAccel, device_),
                       [&](const at::Tensor& d) { return to_accel(d, what); });
    }
    TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::Layout::Strided && !r.is_quantized(), what,
                                " returns a ", r.layout(), " tensor, which accel does not support");
    const c10::Storage storage = accel_storage(r.storage(), what);
    // A view of a normal argument made in inference mode: autograd's view handling gives it
    // the argument's version counter, so it must be a normal tensor too (as ATen's own view
    // kernels make it), not an inference tensor as new tensors in inference mode are.
    const at::Tensor* base = nullptr;
    if (c10::InferenceMode::is_enabled()) {
      for (const auto& [data, argument] : bases_) {
        if (data == r.storage().data() && !argument.is_inference()) base = &argument;
      }
    }
    if (base != nullptr && r.is_nested() && base->is_nested() && base->dtype() == r.dtype()) {
      const auto* nt = at::native::get_nested_tensor_impl(r);
      return at::detail::make_tensor<at::native::NestedTensorImpl>(
          c10::TensorImpl::VIEW, *base, nt->get_nested_sizes(), nt->get_nested_strides(),
          nt->get_storage_offsets());
    }
    if (!r.is_nested()) return accel_tensor_over(storage, r, /*view=*/base != nullptr);
    const at::Tensor buffer =
        whole_buffer(storage, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
    return nested_over(buffer, *at::native::get_nested_tensor_impl(r));
  }

 private:
  // The accel storage the CPU storage `s` views, or a new accel storage with a copy of it.
  c10::Storage accel_storage(const c10::Storage& s, const char* what) {
    if (std::optional<c10::Storage> mine = memory_.find(s.data())) return *mine;
    if (std::optional<c10::Storage> done = copied_.find(s.data())) return *done;
    const size_t bytes = s.nbytes();
    const at::Tensor raw = at::empty({static_cast<int64_t>(bytes)},
                                     at::TensorOptions().dtype(at::kByte).device(kAccel, device_));
    // From the host (waiting), or device to device in accel stream order (cuda: the kernel that
    // made it ran on that stream).
    const at::Tensor source = whole_buffer(
        s, c10::DispatchKeySet(c10::computeDispatchKey(at::kByte, c10::kStrided, s.device())),
        caffe2::TypeMeta::Make<uint8_t>());
    write_result(raw, source, what);
    copied_.storages.emplace_back(s.data(), raw.storage());  // results sharing it share the copy
    return raw.storage();
  }

  void guard(const c10::Storage& s) {
    if (!host_ || s.data() == nullptr || s.nbytes() == 0) return;
    for (const auto& g : guarded_) {
      if (g == s.data()) return;
    }
    guarded_.push_back(s.data());
    access_.push_back(std::make_unique<rt::HostAccessGuard>(s.data(), s.nbytes()));
  }

 private:
  c10::DeviceIndex device_;
  KernelStorages storages_;  // views on the executor's device
  bool host_;                // the host executor: views are read under host-access guards
  AccelMemory memory_;       // the arguments' memory
  AccelMemory copied_;       // the accel copies of new results' CPU memory, by CPU address
  // The sparse arguments, by the tensor of the executor's device they were given as.
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> sparse_;
  // The dense and nested arguments, by the address of their memory.
  std::vector<std::pair<const void*, at::Tensor>> bases_;
  std::vector<const void*> guarded_;
  std::vector<std::unique_ptr<rt::HostAccessGuard>> access_;
};

// Arguments a kernel wrote (in place or out=) whose tensor on the executor's device no longer
// describes them: a sparse tensor's structure, or a dense one resized beyond its memory.
void write_back(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t begin,
                const torch::jit::Stack& given, Converter& convert, const char* what) {
  for (size_t i = 0; i < given.size(); ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite() || !stack[begin + i].isTensor()) continue;
    const at::Tensor& target = stack[begin + i].toTensor();
    if (!is_accel(target) || !given[i].isTensor()) continue;
    const at::Tensor& used = given[i].toTensor();
    if (is_sparse_any(target)) {
      assign_sparse(target, used, [&](const at::Tensor& d) { return convert.to_accel(d, what); });
    } else if (!target.is_nested() && Layout::of(target, false).changed_in(used)) {
      target.resize_(used.sizes());
      target.copy_(used);
    }
  }
}

// The operators that return a nested tensor's own metadata. On the host their results are CPU
// tensors like any other; they must not become accel copies (a later nested kernel would get them
// back as CPU views of accel memory, its result's sizes in accel memory).
bool nested_metadata(const std::string& name) {
  return name == "aten::_nested_tensor_size" || name == "aten::_nested_tensor_strides" ||
         name == "aten::_nested_tensor_storage_offsets";
}

c10::DeviceIndex nested_call_device(const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = begin; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor() && is_accel(v.toTensor())) return v.toTensor().device().index();
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (is_accel(t)) return t.device().index();
      }
    }
  }
  return device::current_device();
}

}  // namespace

void direct_call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = op_name(op);
  // A nested tensor's metadata is the tensor object's own (CPU tensors on every device, as
  // ATen's kernels return them): no kernel, no stream to wait for, any executor or none
  // (autograd asks for the sizes while recording, where an error would abort the process).
  if (nested_metadata(name) && op.schema().arguments().size() == 1 && stack->back().isTensor() &&
      stack->back().toTensor().is_nested()) {
    const auto* nt = at::native::get_nested_tensor_impl(stack->back().toTensor());
    at::Tensor meta = name == "aten::_nested_tensor_size"      ? nt->get_nested_sizes()
                      : name == "aten::_nested_tensor_strides" ? nt->get_nested_strides()
                                                               : nt->get_storage_offsets();
    torch::jit::drop(*stack, 1);
    torch::jit::push(*stack, std::move(meta));
    return;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(executor() != Executor::None, name, ": the ", rt::driver_name(),
                              " driver has no kernels for it (", executor_unavailable_reason(),
                              ")");
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  const c10::DeviceIndex device = nested_call_device(*stack, begin);
  c10::DeviceGuard device_guard(c10::Device(kAccel, device));
  // The CPU's kernel reads the data on this thread: wait for the work queued on it. CUDA's runs
  // in accel stream order.
  if (executor() == Executor::Host) {
    refuse_capture(device, name.c_str(),
                   "it runs its CPU kernel on the calling thread once the stream has drained");
    warn_or_error_on_sync(name.c_str(), "its CPU kernel runs on the calling thread");
    device::call([&] { rt::stream_synchronize(rt::current_stream(device)); }, name.c_str());
  }
  const QuietSyncs quiet;  // the copies of its arguments and results do not report again
  KernelScope scope(device);
  Converter convert(device);
  // An explicit CPU device argument, or a nested tensor's metadata (its sizes, strides and
  // offsets, which live in CPU tensors on every device): the results stay on the CPU.
  bool cpu_target = nested_metadata(name);
  torch::jit::Stack cpu;
  cpu.reserve(n);
  // What ATen's schemas do not mark as written is only read (copy-on-write inputs stay shared);
  // other libraries' operators may write anything.
  const bool aten = name.rfind("aten::", 0) == 0;
  for (size_t i = begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    const c10::AliasInfo* alias = schema.arguments()[i - begin].alias_info();
    const bool write = !aten || (alias != nullptr && alias->isWrite());
    if (v.isTensor()) {
      cpu.emplace_back(convert.to_cpu(v.toTensor(), write));
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : v.toTensorVector()) ts.push_back(convert.to_cpu(t, write));
      cpu.emplace_back(std::move(ts));
    } else if (v.isDevice()) {
      cpu_target = cpu_target || v.toDevice().is_cpu();
      cpu.emplace_back(v.toDevice().type() == kAccel ? kernel_device(v.toDevice().index())
                                                     : v.toDevice());
    } else {
      cpu.push_back(v);
    }
  }
  const torch::jit::Stack given = cpu;  // what the kernel got: in-place kernels change them
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.callBoxed(&cpu);
  }
  if (!cpu_target) write_back(schema, *stack, begin, given, convert, name.c_str());

  std::vector<c10::IValue> results;
  for (size_t j = 0; j < cpu.size(); ++j) {
    const c10::AliasInfo* alias =
        j < schema.returns().size() ? schema.returns()[j].alias_info() : nullptr;
    std::optional<size_t> written;
    if (alias != nullptr && alias->isWrite()) {
      for (size_t i = 0; i < n && !written; ++i) {
        const c10::AliasInfo* a = schema.arguments()[i].alias_info();
        if (a != nullptr && a->isWrite() && a->beforeSets() == alias->beforeSets()) written = i;
      }
    }
    c10::IValue& r = cpu[j];
    if (written) {
      results.push_back((*stack)[begin + *written]);  // in place: the argument itself
    } else if (cpu_target) {
      results.push_back(std::move(r));
    } else if (r.isTensor()) {
      results.emplace_back(convert.to_accel(r.toTensor(), name.c_str()));
    } else if (r.isTensorList()) {
      std::vector<at::Tensor> ts;
      for (const at::Tensor& t : r.toTensorVector())
        ts.push_back(convert.to_accel(t, name.c_str()));
      results.emplace_back(std::move(ts));
    } else {
      results.push_back(std::move(r));
    }
  }
  torch::jit::drop(*stack, n);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&direct_call>());
}

namespace {

// The operators ATen has a NestedTensorCPU kernel for also get direct_call as their
// NestedTensorPrivateUse1 kernel. Many of them are composites for other keys (linear, matmul,
// chunk, narrow, scaled_dot_product_attention), and a composite wins over a fallback: accel's
// nested tensors would get the dense decomposition, which nested tensors refuse ("NestedTensorImpl
// doesn't support sizes") where CPU and CUDA tensors get their nested kernel.
const bool nested_kernels_registered = [] {
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1,
                            __FILE__, __LINE__);
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name :
       dispatcher.getAllOpNamesForDispatchKey(c10::DispatchKey::NestedTensorCPU)) {
    constexpr std::string_view ns = "aten::";
    if (name.name.compare(0, ns.size(), ns) != 0) continue;
    const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1)) continue;
    std::string short_name = name.name.substr(ns.size());
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    lib.impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&direct_call>());
  }
  return true;
}();

}  // namespace

}  // namespace accel::aten
