#include "aten/device_kernel.h"

#include <ATen/ops/from_blob.h>

namespace accel::aten {

Layout Layout::of(const at::Tensor& t) {
  Layout l;
  if (!t.defined()) return l;  // dtype Undefined
  l.data = t.data_ptr();
  l.sizes.assign(t.sizes().begin(), t.sizes().end());
  l.strides.assign(t.strides().begin(), t.strides().end());
  l.dtype = t.scalar_type();
  l.conj = t.is_conj();
  l.neg = t.is_neg();
  return l;
}

at::Tensor Layout::cpu_view() const {
  if (dtype == c10::ScalarType::Undefined) return at::Tensor();
  at::Tensor t = at::from_blob(data, sizes, strides, at::TensorOptions().dtype(dtype));
  if (conj) t._set_conj(true);
  if (neg) t._set_neg(true);
  return t;
}

bool host_accessible() {
  static const bool ok = device::call([] { return rt::device_memory_host_accessible(); });
  return ok;
}

void require_host_accessible(const char* what) {
  TORCH_CHECK_NOT_IMPLEMENTED(host_accessible(), what, ": the ", rt::driver_name(),
                              " driver has no kernel for this yet (only the host driver runs "
                              "CPU kernels on device memory)");
}

}  // namespace accel::aten
