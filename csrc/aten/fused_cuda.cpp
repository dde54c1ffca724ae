#include "aten/fused_cuda.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "aten/executor.h"
#include "device/common.h"

namespace accel::aten {

bool fused_on_cuda() {
  return executor() == Executor::Cuda;
}

void call_cuda_impl(c10::DeviceIndex device, const char* name, torch::jit::Stack args) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  KernelScope scope(device);
  KernelStorages storages(kernel_device(device));
  for (c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == device::kAccel)
      v = Layout::of(v.toTensor()).view(storages);
  }
  op.callBoxed(&args);
}

}  // namespace accel::aten
