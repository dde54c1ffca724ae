#include "aten/host_task.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

namespace accel::aten {
namespace {

c10::Storage cpu_storage(void* base, size_t nbytes) {
  // Not owned: the accel allocator owns the memory. A resize moves the storage to memory of
  // the CPU allocator, never freeing `base`.
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(base, c10::kCPU),
                      c10::GetCPUAllocator(), /*resizable=*/true);
}

}  // namespace

c10::Storage CpuStorages::get(void* base, size_t nbytes) {
  // Empty storages (no memory: several may have the same null base) alias nothing.
  if (base == nullptr || nbytes == 0) return cpu_storage(base, nbytes);
  for (const auto& [b, s] : storages_) {
    if (b == base) return s;
  }
  storages_.emplace_back(base, cpu_storage(base, nbytes));
  return storages_.back().second;
}

Layout Layout::of(const at::Tensor& t, bool write) {
  Layout l;
  if (!t.defined()) return l;  // dtype Undefined
  const c10::Storage& s = t.storage();
  l.base = write ? s.mutable_data() : const_cast<void*>(s.data());
  l.nbytes = s.nbytes();
  l.offset = t.storage_offset();
  l.sizes.assign(t.sizes().begin(), t.sizes().end());
  l.strides.assign(t.strides().begin(), t.strides().end());
  l.dtype = t.scalar_type();
  l.conj = t.is_conj();
  l.neg = t.is_neg();
  return l;
}

at::Tensor Layout::cpu_view(CpuStorages* storages) const {
  if (dtype == c10::ScalarType::Undefined) return at::Tensor();
  c10::Storage s = storages != nullptr ? storages->get(base, nbytes) : cpu_storage(base, nbytes);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(s), c10::DispatchKeySet(c10::DispatchKey::CPU), c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_and_strides(sizes, strides, offset);
  at::Tensor t(std::move(impl));
  if (conj) t._set_conj(true);
  if (neg) t._set_neg(true);
  return t;
}

bool Layout::changed_in(const at::Tensor& v) const {
  return v.storage().data() != base || v.storage_offset() != offset ||
         v.sizes() != c10::IntArrayRef(sizes) || v.strides() != c10::IntArrayRef(strides);
}

void refuse_capture(c10::DeviceIndex device, const char* what, const char* why) {
  device::call([&] { rt::capture_refuse(rt::current_stream(device), what, why); });
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
