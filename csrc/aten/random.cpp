// Random operators whose schema has no Generator argument. Through the CPU fallback they would
// draw from the CPU's default generator, so torch.accel.manual_seed could not make them
// reproducible; here they are composed from operators that take the accel generator (dropout on
// the host executor: one task drawing from it).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>

#include <optional>
#include <tuple>

#include "AccelNativeFunctions.h"
#include "aten/executor.h"
#include "aten/host_task.h"
#include "aten/underlying_task.h"
#include "device/generator.h"

namespace accel::aten {
namespace {

// On the host executor, outside captures, a contiguous input's dropout runs as one task that
// draws the mask and scales the input in place of four operators (an empty mask, bernoulli_,
// mul, mul_), with the same CPU kernels, generator and serial rule, so the same numbers: a tiny
// dropout took 10.8 us on accel against the CPU's 7.2, now 6.8 to 9.5. Elsewhere (the cuda
// executor, a graph capture, which numbers its draws per replay, strided inputs) the operators
// run, and so do dtypes other than float64, float32, float16 and bfloat16, whose errors (an
// integer tensor cannot be scaled in place, float8 has no type promotion) the operators raise at
// the call, where the task would raise them later, at the next synchronization.
bool one_task(const at::Tensor& input) {
  const c10::ScalarType dtype = input.scalar_type();
  const bool scalable =
      dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
  if (executor() != Executor::Host || !input.is_contiguous() || !scalable) return false;
  return !stream_capturing(input.device().index());
}

}  // namespace

// Dropout as torch.nn.functional.dropout runs it on accelerators: (output, keep mask).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  }
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0 ? 0.0 : 1.0 / keep;
  at::Tensor mask =
      at::empty_like(input, input.options().dtype(at::kBool), at::MemoryFormat::Contiguous);
  if (!one_task(input)) {
    mask.bernoulli_(keep);  // draws from the accel generator
    return {input.mul(mask).mul_(scale), mask};
  }
  const c10::DeviceIndex device = input.device().index();
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  // The draw bernoulli_ would take (underlying operators' generator substitution).
  const at::Generator cpu_gen = device::next_cpu_generator(device::default_generator(device));
  const bool serial = input.numel() < serial_numel();  // each operator's rule: same numel
  launch_kernel(device, "aten::native_dropout",
                [in = Layout::of(input, /*write=*/false), o = Layout::of(out), m = Layout::of(mask),
                 cpu_gen, keep, scale, serial](KernelStorages& storages) {
                  std::optional<SerialScope> one_thread;
                  if (serial) one_thread.emplace();
                  at::AutoDispatchBelowADInplaceOrView below_autograd;
                  NotAnOperator not_an_operator;
                  at::Tensor mask_view = m.view(storages);
                  at::Tensor out_view = o.view(storages);
                  mask_view.bernoulli_(keep, cpu_gen);
                  at::mul_out(out_view, in.view(storages), mask_view);
                  out_view.mul_(scale);
                });
  return {out, mask};
}

}  // namespace accel::aten
