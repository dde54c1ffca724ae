#include "aten/host_task.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>

namespace accel::aten {
namespace {

c10::Storage kernel_storage(void* base, size_t nbytes, c10::Device device) {
  // Not owned: the accel allocator owns the memory. A resize moves the storage to memory of
  // the device's own allocator, never freeing `base`.
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(base, device),
                      c10::GetAllocator(device.type()), /*resizable=*/true);
}

at::Tensor make_view(const Layout& l, c10::Storage s, c10::Device device) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(s), c10::DispatchKeySet(c10::computeDispatchKey(l.dtype, c10::kStrided, device)),
      c10::scalarTypeToTypeMeta(l.dtype));
  impl->set_sizes_and_strides(l.sizes, l.strides, l.offset);
  at::Tensor t(std::move(impl));
  if (l.conj) t._set_conj(true);
  if (l.neg) t._set_neg(true);
  return t;
}

}  // namespace

c10::Storage KernelStorages::get(void* base, size_t nbytes) {
  // Empty storages (no memory: several may have the same null base) alias nothing.
  if (base == nullptr || nbytes == 0) return kernel_storage(base, nbytes, device_);
  for (const auto& [b, s] : storages_) {
    if (b == base) return s;
  }
  storages_.emplace_back(base, kernel_storage(base, nbytes, device_));
  return storages_.back().second;
}

Layout Layout::of(const at::Tensor& t, bool write) {
  Layout l;
  if (!t.defined()) return l;  // dtype Undefined
  TORCH_CHECK(!t._is_zerotensor(),
              "accel: an efficient zero tensor (no memory) reached a kernel "
              "that reads its memory; materialize it with .clone() first");
  const c10::Storage& s = t.storage();
  l.base = write ? s.mutable_data() : const_cast<void*>(s.data());
  l.nbytes = s.nbytes();
  // Work captured into a graph keeps the memory it uses.
  if (l.base != nullptr && t.device().type() == device::kAccel) {
    keep_for_capture(t.device().index(), {l.base});
  }
  l.offset = t.storage_offset();
  l.sizes.assign(t.sizes().begin(), t.sizes().end());
  l.strides.assign(t.strides().begin(), t.strides().end());
  l.dtype = t.scalar_type();
  l.conj = t.is_conj();
  l.neg = t.is_neg();
  return l;
}

at::Tensor Layout::view(KernelStorages& storages) const {
  if (dtype == c10::ScalarType::Undefined) return at::Tensor();
  return make_view(*this, storages.get(base, nbytes), storages.device());
}

at::Tensor Layout::view_on(c10::Device device) const {
  if (dtype == c10::ScalarType::Undefined) return at::Tensor();
  return make_view(*this, kernel_storage(base, nbytes, device), device);
}

bool Layout::changed_in(const at::Tensor& v) const {
  return v.storage().data() != base || v.storage_offset() != offset ||
         v.sizes() != c10::IntArrayRef(sizes) || v.strides() != c10::IntArrayRef(strides);
}

bool stream_capturing(c10::DeviceIndex device) {
  // The device's flag first: it spares the current stream's lookup outside captures.
  return device::call([&] {
    return rt::device_is_capturing(device) &&
           rt::stream_capture_id(rt::current_stream(device)) != 0;
  });
}

void keep_for_capture(c10::DeviceIndex device, c10::ArrayRef<const void*> ptrs) {
  if (!rt::device_is_capturing(device)) return;
  const rt::Stream s = rt::current_stream(device);
  for (const void* p : ptrs) rt::capture_keep_memory(s, p);
}

void refuse_capture(c10::DeviceIndex device, const char* what, const char* why) {
  device::call([&] { rt::capture_refuse(rt::current_stream(device), what, why); });
}

namespace {
std::atomic<int> g_sync_debug_mode{0};
thread_local bool t_quiet_syncs = false;
}  // namespace

QuietSyncs::QuietSyncs() : was_(t_quiet_syncs) {
  t_quiet_syncs = true;
}
QuietSyncs::~QuietSyncs() {
  t_quiet_syncs = was_;
}

SyncDebugMode sync_debug_mode() {
  return static_cast<SyncDebugMode>(g_sync_debug_mode.load(std::memory_order_relaxed));
}

void set_sync_debug_mode(SyncDebugMode mode) {
  g_sync_debug_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
}

void warn_or_error_on_sync(const char* what, const char* why) {
  const SyncDebugMode mode = sync_debug_mode();
  if (C10_LIKELY(mode == SyncDebugMode::Disabled) || t_quiet_syncs) return;
  const std::string message = c10::str("called a synchronizing accel operation: ", what,
                                       " waits for the accel stream (", why, ")");
  TORCH_CHECK(mode != SyncDebugMode::Error, message,
              "; torch.accel.set_sync_debug_mode('error') forbids it");
  TORCH_WARN(message);
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
