// Structural operators: they create tensors or change storage and metadata, so they are always
// native (DESIGN.md): empty, empty_strided, the view operators, resize_, set_, record_stream.
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_unsafe_view_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "AccelNativeFunctions.h"
#include "device/allocator.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

void check_creatable(std::optional<c10::Layout> layout, std::optional<bool> pin_memory,
                     c10::ScalarType dtype, const char* op) {
  TORCH_CHECK_NOT_IMPLEMENTED(!layout || *layout == c10::Layout::Strided, op,
                              ": accel tensors are dense (strided); layout ", *layout,
                              " is not supported");
  TORCH_CHECK(!pin_memory.value_or(false), op,
              ": only CPU tensors can be pinned; accel memory is device memory");
  TORCH_CHECK_NOT_IMPLEMENTED(!c10::isQIntType(dtype), op, ": accel does not support quantized ",
                              "dtype ", dtype);
}

// torch.use_deterministic_algorithms(True) with fill_uninitialized_memory (the default): new
// memory is filled with NaN (integers: their maximum), as on the CPU and CUDA.
bool fill_uninitialized() {
  const at::Context& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor filled_if_deterministic(at::Tensor t) {
  if (C10_UNLIKELY(fill_uninitialized())) at::native::fill_empty_deterministic_(t);
  return t;
}

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  if (device && device->has_index()) return device::resolve_device(device->index());
  return device::current_device();
}

}  // namespace

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  const c10::ScalarType st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  check_creatable(layout, pin_memory, st, "empty");
  c10::DeviceGuard guard(c10::Device(kAccel, index_of(device)));
  return filled_if_deterministic(at::detail::empty_generic(
      size, device::device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st,
      memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const c10::ScalarType st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  check_creatable(layout, pin_memory, st, "empty_strided");
  c10::DeviceGuard guard(c10::Device(kAccel, index_of(device)));
  return filled_if_deterministic(
      at::detail::empty_strided_generic(size, stride, device::device_allocator(),
                                        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st));
}

namespace {

// Makes sure `storage` holds at least `bytes`, growing it in stream order.
void ensure_storage(const c10::Storage& storage, size_t bytes) {
  if (bytes <= storage.nbytes()) return;
  at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(storage, bytes);
}

size_t needed_bytes(c10::IntArrayRef size, c10::IntArrayRef stride, size_t itemsize,
                    int64_t offset) {
  for (int64_t s : size) {
    if (s == 0) return 0;
  }
  return at::detail::computeStorageNbytes(size, stride, itemsize, static_cast<size_t>(offset));
}

}  // namespace

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  for (int64_t s : size) {
    TORCH_CHECK(s >= 0, "resize_: sizes must be non-negative, got ", size);
  }
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  // Same sizes: the tensor keeps its strides (an out= tensor keeps its layout), as on the CPU.
  if (impl->sizes() == size && !memory_format) return self;
  c10::DeviceGuard guard(self.device());
  const size_t old_nbytes = impl->unsafe_storage().nbytes();
  impl->set_sizes_contiguous(size);
  ensure_storage(impl->unsafe_storage(),
                 needed_bytes(size, impl->strides(), self.itemsize(), impl->storage_offset()));
  if (C10_UNLIKELY(fill_uninitialized())) {
    at::native::fill_resize_deterministic_(self, static_cast<int64_t>(old_nbytes));
  }
  if (memory_format) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "resize_: unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_source_Storage_storage_offset(at::Tensor& self, c10::Storage source,
                                              int64_t storage_offset, c10::IntArrayRef size,
                                              c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "set_: the storage is on ", source.device(),
              " but the tensor is on ", self.device());
  TORCH_CHECK(storage_offset >= 0, "set_: storage_offset must be non-negative, got ",
              storage_offset);
  TORCH_CHECK(stride.empty() || stride.size() == size.size(), "set_: got ", size.size(),
              " sizes but ", stride.size(), " strides");
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  c10::DeviceGuard guard(self.device());
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  ensure_storage(impl->unsafe_storage(),
                 needed_bytes(impl->sizes(), impl->strides(), self.itemsize(), storage_offset));
  return self;
}

at::Tensor& set_source_Storage(at::Tensor& self, c10::Storage source) {
  const size_t itemsize = self.itemsize();
  TORCH_CHECK(source.nbytes() % itemsize == 0, "set_: the storage has ", source.nbytes(),
              " bytes, not a multiple of the element size ", itemsize, " of ", self.dtype());
  const int64_t n = static_cast<int64_t>(source.nbytes() / itemsize);
  return set_source_Storage_storage_offset(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_source_Tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  TORCH_CHECK(self.dtype() == source.dtype(), "set_: the source tensor has dtype ", source.dtype(),
              " but the tensor has ", self.dtype());
  return set_source_Storage_storage_offset(self, source.storage(), source.storage_offset(),
                                           source.sizes(), source.strides());
}

at::Tensor& set_(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device::device_allocator(),
                     /*resizable=*/true);
  return set_source_Storage_storage_offset(self, std::move(empty), 0, {0}, {});
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor _unsafe_view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::_unsafe_view(self, size);
}

at::Tensor _reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

// `param.data = t` and Module.to() (which keeps Parameter objects when this is true) ask
// whether one tensor's impl can take the other's metadata. c10 knows only its own dense
// backends; accel tensors are dense and strided like CPU and CUDA tensors, so accel and those
// are interchangeable, as CPU and CUDA are.
bool _has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::Layout::Strided && !t.is_quantized() && !t.is_nested() &&
           (t.device().type() == kAccel ||
            t.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(
                c10::DispatchKeySet(c10::DispatchKey::CPU)));
  };
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  return dense(self) && dense(from);
}

namespace {

// The memory of efficient zero tensors: none. The ZeroTensor dispatch key makes operators see
// zeros (PyTorch's ZeroTensor fallback materializes them where an operator needs the data).
class ZeroTensorAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t) override {
    return {nullptr, nullptr, &no_delete, c10::Device(kAccel, device::current_device())};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &no_delete; }
  void copy_data(void*, const void*, std::size_t) const override {}

 private:
  static void no_delete(void*) {}
};

}  // namespace

at::Tensor _efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout,
                                std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const c10::ScalarType st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  check_creatable(layout, pin_memory, st, "_efficientzerotensor");
  c10::DeviceGuard guard(c10::Device(kAccel, index_of(device)));
  static ZeroTensorAllocator allocator;  // never freed: storages keep a pointer to it
  return at::detail::empty_generic(
      size, &allocator,
      c10::DispatchKeySet({c10::DispatchKey::PrivateUse1, c10::DispatchKey::ZeroTensor}), st,
      std::nullopt);
}

at::Tensor _pin_memory(const at::Tensor& self, std::optional<c10::Device>) {
  TORCH_CHECK(false, "cannot pin '", self.toString(),
              "': only dense CPU tensors can be pinned (accel memory is device memory)");
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  void* base = self.storage().mutable_data();
  if (base == nullptr) return;
  device::call([&] { rt::record_stream(base, device::to_rt(stream)); }, "record_stream");
}

}  // namespace accel::aten

// _has_compatible_shallow_copy_type at the autograd key too. PyTorch's kernel is a composite one,
// which answers at a tensor's autograd key, above the Python key; with accel's backend kernel
// alone, a wrapper subclass on accel (torchao's NF4Tensor) met the call in its
// __torch_dispatch__, and Module.to("accel") of such parameters failed where .to("cpu") works.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type",
         TORCH_FN(accel::aten::_has_compatible_shallow_copy_type));
}
