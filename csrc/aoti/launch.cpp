// Launching the kernels of Inductor's C++ wrapper and of AOTInductor models on accel streams.
//
// The generated wrapper (torch_accel/include/torch_accel_aoti.h) packs each kernel call into a
// closure and hands it here with its device: it runs as a task on that device's current accel
// stream, so compiled code is ordered with eager accel work and with the extern kernels the
// wrapper calls through accel's C shim (generated: c_shim_accel.cpp), exactly as the Python
// wrapper's kernels are (csrc/python/inductor_bindings.cpp). A C function, so that code compiled
// by Inductor (or shipped in an AOTInductor package) needs no C++ type of accel's.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/UndefinedTensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "aten/host_task.h"
#include "device/common.h"
#include "runtime/runtime.h"

namespace rt = accel::rt;

namespace {

// Labels outlive the generated library (a captured graph keeps them for its debug dumps).
const char* intern(const char* name) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> names;
  std::lock_guard<std::mutex> lock(mu);
  return names.emplace(name != nullptr ? name : "inductor kernel").first->c_str();
}

}  // namespace

extern "C" AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_launch(
    int32_t device, void (*run)(void*), void (*drop)(void*), void* payload, const char* name) {
  // Owned from here on, launched or not.
  std::shared_ptr<void> closure(payload, drop);
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    const char* label = intern(name);
    accel::device::call(
        [&] {
          // The kernels are host code reading device memory.
          static const bool host_memory = rt::device_memory_host_accessible();
          TORCH_CHECK_NOT_IMPLEMENTED(
              host_memory, label,
              ": kernels torch.compile generated for accel run on the host, and the ",
              rt::driver_name(),
              " driver's device memory is not host memory; run eagerly, or with "
              "ACCEL_DRIVER=host");
          const rt::Stream s = rt::current_stream(device);
          rt::launch_host_func(s, rt::Task([run, closure] { run(closure.get()); }), label);
        },
        label);
  });
}

extern "C" AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_capture_keep(int32_t device,
                                                                          const void* const* ptrs,
                                                                          int32_t n) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    accel::device::call(
        [&] {
          accel::aten::keep_for_capture(device, {ptrs, static_cast<size_t>(n)});
        },
        "aoti_torch_accel_capture_keep");
  });
}

extern "C" AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_current_device(int32_t* index) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *index = accel::device::current_device(); });
}

namespace {

// An AOTInductor model keeps its weights as CPU tensors (AOTInductor's model runtime knows no
// device but cpu, cuda, xpu and mps: cpp_wrapper.py records accel's constants as CPU ones). Each
// CPU storage is copied to the accel device once (tied weights and views of one storage share
// the copy), and each constant's accel view of it is made once: a run finds its constants
// without copying or making tensors. Entries hold their CPU source weakly and are dropped once
// it is freed (a model deleted, weights swapped for others), in a sweep every so many lookups.
template <class Impl, class Null = c10::detail::intrusive_target_default_null_type<Impl>>
struct DeviceCopy {
  c10::weak_intrusive_ptr<Impl, Null> source;
  at::Tensor copy;
};
template <class Impl, class Null = c10::detail::intrusive_target_default_null_type<Impl>>
using CopyMap = std::map<std::pair<const Impl*, c10::DeviceIndex>, DeviceCopy<Impl, Null>>;

struct DeviceCopies {
  std::mutex mu;
  CopyMap<c10::StorageImpl> storages;
  CopyMap<c10::TensorImpl, c10::UndefinedTensorImpl> views;
  std::size_t lookups = 0;  // since the last sweep
};
DeviceCopies copies;

template <class Map>
void drop_expired(Map& map) {
  for (auto it = map.begin(); it != map.end();) {
    it = it->second.source.expired() ? map.erase(it) : std::next(it);
  }
}

at::Tensor device_copy(const at::Tensor& cpu, c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(copies.mu);
  // Amortized: a sweep per as many lookups as there are views.
  if (++copies.lookups > copies.views.size()) {
    drop_expired(copies.views);
    drop_expired(copies.storages);
    copies.lookups = 0;
  }
  // A live source's entry is its own: the weak reference keeps a freed source's address taken.
  if (auto view = copies.views.find({cpu.unsafeGetTensorImpl(), device});
      view != copies.views.end()) {
    return view->second.copy;
  }
  auto raw = copies.storages.find({cpu.storage().unsafeGetStorageImpl(), device});
  if (raw == copies.storages.end()) {
    // The whole storage, so that every view of it (offset, strides) maps to the copy.
    const int64_t bytes = static_cast<int64_t>(cpu.storage().nbytes());
    at::Tensor copy = at::empty_strided(
        {bytes}, {1}, at::TensorOptions().dtype(at::kByte).device(accel::device::kAccel, device));
    copy.copy_(at::empty({0}, at::kByte).set_(cpu.storage(), 0, {bytes}, {1}));
    raw = copies.storages
              .emplace(std::make_pair(cpu.storage().unsafeGetStorageImpl(), device),
                       DeviceCopy<c10::StorageImpl>{cpu.storage().getWeakStorageImpl(), copy})
              .first;
  }
  at::Tensor view =
      at::empty({0}, cpu.options().device(raw->second.copy.device()))
          .set_(raw->second.copy.storage(), cpu.storage_offset(), cpu.sizes(), cpu.strides());
  copies.views.emplace(
      std::make_pair(cpu.unsafeGetTensorImpl(), device),
      DeviceCopy<c10::TensorImpl, c10::UndefinedTensorImpl>{
          c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(cpu.getIntrusivePtr()),
          view});
  return view;
}

}  // namespace

// The accel tensor of an AOTInductor model's constant (a CPU tensor) on the current device.
extern "C" AOTI_TORCH_EXPORT AOTITorchError aoti_torch_accel_constant(AtenTensorHandle cpu,
                                                                      AtenTensorHandle* out) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    const at::Tensor& t = *torch::aot_inductor::tensor_handle_to_tensor_pointer(cpu);
    if (t.device().type() == accel::device::kAccel) {
      *out = torch::aot_inductor::new_tensor_handle(at::Tensor(t));
    } else {
      TORCH_CHECK(t.device().is_cpu(), "an AOTInductor constant on ", t.device(),
                  " in a model compiled for accel");
      *out =
          torch::aot_inductor::new_tensor_handle(device_copy(t, accel::device::current_device()));
    }
  });
}
