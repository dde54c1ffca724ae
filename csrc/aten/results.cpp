#include "aten/results.h"

#include <ATen/EmptyTensor.h>

#include "device/allocator.h"
#include "device/common.h"

namespace accel::aten {

at::Tensor allocate(const TensorMeta& m) {
  if (m.dtype == c10::ScalarType::Undefined) return at::Tensor();
  at::Tensor t = at::detail::empty_strided_generic(
      m.sizes, m.strides, device::device_allocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), m.dtype);
  if (m.conj) t._set_conj(true);
  if (m.neg) t._set_neg(true);
  return t;
}

void adopt_layout(const at::Tensor& t, const TensorMeta& m) {
  if (m.describes(t)) return;
  t.resize_(m.sizes);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes, m.strides);
}

void write_result(const at::Tensor& dst, const at::Tensor& src, const char* what) {
  const size_t bytes = static_cast<size_t>(src.numel()) * src.itemsize();
  if (bytes == 0) return;
  device::call(
      [&] {
        if (src.is_cpu()) {
          rt::memcpy(dst.data_ptr(), src.data_ptr(), bytes, rt::CopyKind::HostToDevice);
        } else {  // memory of the same GPU (pointer attributes say so): no host round trip
          rt::memcpy_async(dst.data_ptr(), src.data_ptr(), bytes, rt::CopyKind::DeviceToDevice,
                           rt::current_stream(dst.device().index()));
        }
      },
      what);
}

at::Tensor accel_tensor_over(c10::Storage storage, const at::Tensor& like, bool view) {
  const c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  auto impl =
      view ? c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, std::move(storage),
                                                  keys | c10::getAutogradRelatedKeySetFromBackend(
                                                             c10::BackendComponent::PrivateUse1Bit),
                                                  like.dtype())
           : c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  at::Tensor out(std::move(impl));
  if (like.is_conj()) out._set_conj(true);
  if (like.is_neg()) out._set_neg(true);
  return out;
}

at::Tensor to_accel(const at::Tensor& r, const char* what) {
  if (!r.defined()) return r;
  TORCH_CHECK_NOT_IMPLEMENTED(r.layout() == c10::Layout::Strided && !r.is_quantized(), what,
                              " returns a ", r.layout(), r.is_quantized() ? " quantized" : "",
                              " tensor, which accel does not support (accel tensors are dense "
                              "and strided)");
  at::Tensor dense = r.is_non_overlapping_and_dense() ? r : r.contiguous();
  at::Tensor out = allocate(TensorMeta::of(dense));
  write_result(out, dense, what);
  return out;
}

}  // namespace accel::aten
