// What accel's fused operators (fused_rope.cpp, fused_linear.cpp, fused_attention.cpp) share:
// the kernels' element type of a tensor, running a host kernel where a tensor's memory is, and
// autocast's cast to its lower precision.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <utility>

#include "aten/host_task.h"
#include "aten/parallel.h"
#include "device/common.h"
#include "kernels/host/numeric.h"

namespace accel::aten {

// The host kernels' element type of `t` (`what` names it in the error for other dtypes).
inline kernels::host::Dtype kernel_dtype(const char* op, const char* what, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return kernels::host::Dtype::Float32;
    case at::kBFloat16: return kernels::host::Dtype::BFloat16;
    case at::kHalf: return kernels::host::Dtype::Float16;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", what, " of dtype ", t.scalar_type(),
                                  " is not supported (float32, bfloat16 or float16)");
  }
}

// Runs f(parallel) where `like`'s memory is: at once for a CPU tensor, else as a task on the
// current stream of its accel device.
template <class F>
void run_host_kernel(const at::Tensor& like, const char* op, F f) {
  if (like.is_cpu()) {
    f(intra_op_parallel());
    return;
  }
  TORCH_CHECK(like.device().type() == device::kAccel, op, ": expected accel or CPU tensors, got ",
              like.device());
  launch(like.device().index(), op, [f = std::move(f)] { f(intra_op_parallel()); });
}

// An autocast kernel's set-up: while alive, autocast is off for the calling thread, and
// operator() casts a tensor to autocast's lower precision (as F.linear's and SDPA's inputs).
class AutocastLowerPrecision {
 public:
  at::Tensor operator()(const at::Tensor& t) const {
    return at::autocast::cached_cast(dtype_, t, c10::DeviceType::PrivateUse1);
  }

 private:
  c10::impl::ExcludeDispatchKeyGuard no_autocast_{c10::DispatchKey::AutocastPrivateUse1};
  at::ScalarType dtype_ =
      at::autocast::get_lower_precision_fp_from_device_type(c10::DeviceType::PrivateUse1);
};

}  // namespace accel::aten
