#include "aten/underlying_caller.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/record_function.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "aten/dispatch_util.h"
#include "aten/executor.h"
#include "aten/host_task.h"
#include "aten/results.h"
#include "device/common.h"

namespace accel::aten {

namespace {

// `t` with the strides a contiguous tensor of its sizes is made with (those make_contiguous gives
// later calls' results), also in its dimensions of size 1: is_contiguous() ignores those, and a
// channels-last [N, C, 1, 1] result (a depthwise convolution run channels-last, see
// convolution.cpp) sent the next CPU kernel down its channels-last path, unlike the CPU's.
at::Tensor with_contiguous_strides(const at::Tensor& t) {
  return t.strides() == c10::IntArrayRef(c10::contiguous_strides(t.sizes()))
             ? t
             : t.clone(at::MemoryFormat::Contiguous);
}

}  // namespace

void materialize_written(const SchemaInfo& info, const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = 0; i < info.write_argument.size(); ++i) {
    const c10::IValue& v = stack[begin + i];
    if (!info.write_argument[i]) continue;
    if (v.isTensor() && v.toTensor().defined()) {
      (void)v.toTensor().storage().mutable_data();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) (void)t.storage().mutable_data();
    }
  }
}

namespace {

// The accel tensors among a call's arguments, with the views the kernel got of them.
using Viewed = c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4>;  // (view, accel tensor)

// A result the kernel made over an argument's memory where the schema calls it new (a float
// tensor's dequantize() returns the tensor itself, as CUDA's kernel does): the accel argument
// itself, or an accel tensor over its memory. Copying such a result "to accel" would read accel
// memory as the host's.
std::optional<at::Tensor> over_argument(const at::Tensor& r, const Viewed& viewed) {
  if (!r.defined() || !r.has_storage()) return std::nullopt;
  for (const auto& [view, accel] : viewed) {
    if (r.unsafeGetTensorImpl() == view.unsafeGetTensorImpl()) return accel;
  }
  for (const auto& [view, accel] : viewed) {
    if (view.has_storage() && r.storage().is_alias_of(view.storage())) {
      return accel_tensor_over(accel.storage(), r);
    }
  }
  return std::nullopt;
}

}  // namespace

std::shared_ptr<CachedResult> run_on_caller(const OpConfig& config, const SchemaInfo& info,
                                            const c10::OperatorHandle& op, torch::jit::Stack* stack,
                                            c10::DeviceIndex device, bool synchronize,
                                            const CachedResult* expected) {
  const size_t n = op.schema().arguments().size();
  const size_t begin = stack->size() - n;
  // The host's CPU kernel reads the memory now: the stream drains first. CUDA's kernel runs in
  // the accel stream's order (one that needs its result shape synchronizes that stream).
  // Either way such a call waits for its data on the host: never during a capture.
  const bool host = executor() == Executor::Host;
  if (synchronize) {
    refuse_capture(device, config.name,
                   "it runs on the calling thread once the stream has drained (its result "
                   "shape depends on the data, or it returns a value to the host)");
    // The first call of a signature (expected: its meta results) is accel's warm-up, not
    // the operator's wait: it does not report. CUDA's kernels run without waiting where
    // only the host's need the stream drained (no meta function for the results).
    if (expected == nullptr && (config.sync || !info.tensor_returns_only || host)) {
      warn_or_error_on_sync(config.name,
                            config.sync ? "its result shape depends on the data"
                            : !info.tensor_returns_only
                                ? "it returns a value to the host"
                                : "accel cannot know its results before it runs: their "
                                  "shape depends on the data, or no meta function describes "
                                  "them for these arguments");
    }
    if (host) {
      device::call([&] { rt::stream_synchronize(rt::current_stream(device)); }, config.name);
    }
  }
  KernelScope scope(device);
  KernelStorages storages(kernel_device(device));
  std::vector<std::unique_ptr<rt::HostAccessGuard>> access;
  c10::SmallVector<const void*, 8> accessed;
  std::vector<at::Tensor> written_views(n);  // the CPU views of written accel tensors
  materialize_written(info, *stack, begin);
  bool write = false;  // whether the argument being viewed is written
  Viewed viewed;
  const auto view = [&](const at::Tensor& t) {
    const Layout l = Layout::of(t, write);
    if (host && std::find(accessed.begin(), accessed.end(), l.base) == accessed.end()) {
      accessed.push_back(l.base);
      access.push_back(std::make_unique<rt::HostAccessGuard>(l.base, l.nbytes));
    }
    at::Tensor v = l.view(storages);
    // Operators that only inspect their arguments may look at requires_grad too (the
    // attention backend choice does).
    if (config.metadata_only && t.requires_grad()) v.set_requires_grad(true);
    viewed.emplace_back(v, t);
    return v;
  };
  torch::jit::Stack cpu;
  cpu.reserve(n);
  for (size_t i = begin; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    write = info.write_argument[i - begin];
    if (v.isTensor() && is_accel(v.toTensor())) {
      cpu.emplace_back(view(v.toTensor()));
      if (info.write_argument[i - begin]) written_views[i - begin] = cpu.back().toTensor();
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
    } else if (v.isDevice() && v.toDevice().type() == device::kAccel) {
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
    const bool serial = host && small_call(*stack, begin, expected, info.serial);
    const auto call = [&] {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      std::optional<SerialScope> one_thread;
      if (serial) one_thread.emplace();
      info.kernel(op).callBoxed(&cpu);
    };
    c10::WarningUtils::WarningHandlerGuard see(&warnings);
    if (host && synchronize) {
      // On the stream's worker, as tasks run (see run_on_stream), not as an operator of its
      // own in a profile (as Work::run).
      run_on_stream(device, config.name, [&] {
        NotAnOperator not_an_operator;
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
    const bool resized = before.changed_in(v);
    if (!resized && (v.is_conj() != t.is_conj() || v.is_neg() != t.is_neg())) {
      // The kernel flipped the view's conjugate or negative bit (see Work::run): the values go
      // into the memory, resolved, and the accel tensor keeps its bits.
      before.view(storages).copy_(v);
    } else if (resized) {
      // The task could not apply this: keep calls synchronous. An empty out= tensor the
      // kernel sized is sized before the task of later calls (seen->written) instead.
      if (t.numel() != 0 || !info.out_argument[i]) seen->run_on_caller = true;
      if (v.storage().data() == before.base) {
        t.unsafeGetTensorImpl()->set_sizes_and_strides(v.sizes(), v.strides(), v.storage_offset());
      } else {
        const at::Tensor dense = v.is_non_overlapping_and_dense() ? v : v.contiguous();
        t.unsafeGetTensorImpl()->set_storage_offset(0);
        adopt_layout(t, TensorMeta::of(dense));
        if (dense.is_cpu()) {
          t.copy_(dense);
        } else {
          write_result(t, dense, config.name);
        }
      }
    }
    seen->written[i] = TensorMeta::of(t);
  }
  // The results: a written argument's accel tensor itself (its view was written in place),
  // else the accel tensor over the argument a result lies in (over_argument), else accel copies
  // of the CPU results.
  const auto accel_result = [&](const at::Tensor& t, bool contiguous) {
    if (std::optional<at::Tensor> same = over_argument(t, viewed)) {
      seen->run_on_caller = true;  // later calls return the argument too, not a copy
      return std::move(*same);
    }
    return to_accel(contiguous && t.defined() ? with_contiguous_strides(t) : t, config.name);
  };
  c10::SmallVector<c10::IValue, 3> results;
  for (size_t j = 0; j < cpu.size(); ++j) {
    const std::optional<size_t> alias =
        j < info.return_alias.size() ? info.return_alias[j] : std::nullopt;
    const c10::IValue& r = cpu[j];
    if (alias) {
      results.push_back((*stack)[begin + *alias]);
      seen->results.push_back({TensorMeta::of(results.back().toTensor())});
      seen->result_is_list.push_back(false);
    } else if (r.isTensor()) {
      results.emplace_back(accel_result(r.toTensor(), config.contiguous_results));
      seen->results.push_back({TensorMeta::of(results.back().toTensor())});
      seen->result_is_list.push_back(false);
    } else if (r.isTensorList()) {
      std::vector<at::Tensor> ts;
      std::vector<TensorMeta> ms;
      for (const at::Tensor& t : r.toTensorVector()) {
        ts.push_back(accel_result(t, false));
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

bool cpu_copies_results(const CachedResult& r) {
  for (const std::vector<TensorMeta>& list : r.results) {
    for (const TensorMeta& m : list) {
      if (m.dtype != c10::ScalarType::Undefined && !cpu_copy_takes(m.dtype)) return false;
    }
  }
  return true;
}

// out= arguments the meta pass resized get the same shape on accel. Tensors written in place
// never change shape (some Python meta functions resize them, atan2_'s: the CPU kernel then
// refuses the call, on the caller).
void resize_written(const SchemaInfo& info, const CachedResult& shapes,
                    const torch::jit::Stack& stack, size_t begin, bool only_empty) {
  for (size_t i = 0; i < info.write_argument.size(); ++i) {
    if (!info.out_argument[i] || !shapes.written[i]) continue;
    const at::Tensor& t = stack[begin + i].toTensor();
    // Before the first call runs, only the empty out= tensors the kernel would resize: one
    // of the right shape already keeps its strides (resize_output leaves it alone).
    if (only_empty && (t.numel() != 0 || t.sizes().equals(shapes.written[i]->sizes))) continue;
    adopt_layout(t, *shapes.written[i]);
  }
}

// The layouts of the written accel tensors, before a call that may resize them.
std::vector<std::optional<Layout>> written_layouts(const SchemaInfo& info,
                                                   const torch::jit::Stack& stack, size_t begin) {
  std::vector<std::optional<Layout>> layouts(info.write_argument.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    if (!info.write_argument[i] || !stack[begin + i].isTensor()) continue;
    const at::Tensor& t = stack[begin + i].toTensor();
    if (is_accel(t)) layouts[i] = Layout::of(t);
  }
  return layouts;
}

// Gives written tensors back the sizes, strides and offset they had (storage that grew stays
// grown: its first bytes are the old contents).
void restore_written(const std::vector<std::optional<Layout>>& layouts,
                     const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = 0; i < layouts.size() && begin + i < stack.size(); ++i) {
    if (!layouts[i] || !stack[begin + i].isTensor()) continue;
    const at::Tensor& t = stack[begin + i].toTensor();
    t.unsafeGetTensorImpl()->set_sizes_and_strides(layouts[i]->sizes, layouts[i]->strides,
                                                   layouts[i]->offset);
  }
}

}  // namespace accel::aten
