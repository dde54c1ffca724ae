// Running CPU kernels on accel memory in stream order (drivers whose device memory is host
// memory, i.e. the host driver).
//
// A task captures the raw layout of its tensors (storage, offset, sizes, strides, dtype,
// conj/neg bits), never the tensors themselves: as with CUDA kernels, the stream-ordered caching
// allocator keeps the memory valid for work already enqueued. Inside the task, CPU tensors are
// built over the same memory and the ATen CPU kernel runs on them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>

#include <utility>

#include "device/common.h"

namespace accel::aten {

// The storages of one kernel call's views of accel memory, on the device whose ATen kernels
// run there (the CPU for the host driver, CUDA for the cuda driver: see executor.h). Views of one
// accel storage get one storage, so the kernel's overlap checks (an out= tensor that overlaps an
// input) see what aliases what. The storages are resizable: a kernel that resizes an out= tensor
// beyond its storage moves it to new memory of that device, which the caller detects
// (Layout::changed_in) and copies back.
class KernelStorages {
 public:
  explicit KernelStorages(c10::Device device = c10::Device(c10::kCPU)) : device_(device) {}
  c10::Device device() const { return device_; }
  c10::Storage get(void* base, size_t nbytes);

 private:
  c10::Device device_;
  c10::SmallVector<std::pair<void*, c10::Storage>, 4> storages_;
};

struct Layout {
  void* base = nullptr;  // the start of the storage
  size_t nbytes = 0;     // the size of the storage
  int64_t offset = 0;    // storage offset, in elements
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool conj = false;
  bool neg = false;

  // An undefined tensor has dtype Undefined, and its views are undefined too. `write`: the
  // work writes the tensor, so a copy-on-write storage gets its own memory first; a tensor that
  // is only read keeps sharing it (a lazy clone stays lazy, as on the CPU).
  static Layout of(const at::Tensor& t, bool write = true);
  // A tensor of `storages`' device over this memory; views made with the same `storages` share
  // the storage of their accel storage.
  at::Tensor view(KernelStorages& storages) const;
  // A tensor of `device` over this memory, alone.
  at::Tensor view_on(c10::Device device) const;
  // A CPU tensor over this memory (only where device memory is host memory: the host driver).
  at::Tensor cpu_view() const { return view_on(c10::Device(c10::kCPU)); }
  // Whether the CPU view `v` of this layout no longer describes it: resized or moved.
  bool changed_in(const at::Tensor& v) const;
};

// Whether the driver's device memory is host memory (asked once: the driver does not change).
bool host_accessible();

// Throws NotImplementedError naming `what` unless the driver's device memory is host memory.
void require_host_accessible(const char* what);

// Whether the CPU's copy kernel copies tensors of `dtype` (it refuses the bit, sub-byte and
// float4 dtypes, whose bytes accel's own copies move); probed once per dtype (copy.cpp).
bool cpu_copy_takes(c10::ScalarType dtype);

// Whether the current stream of `device` is capturing a graph.
bool stream_capturing(c10::DeviceIndex device);

// If the current stream of `device` is capturing a graph, the graph keeps the memory at each of
// `ptrs` until it is reset or destroyed (rt::capture_keep_memory): for work launched on that
// stream, so that a replay after the tensors there were freed and the cache emptied finds the
// memory mapped. Nothing otherwise (one flag read).
void keep_for_capture(c10::DeviceIndex device, c10::ArrayRef<const void*> ptrs);

// If the current stream of `device` is capturing a graph: invalidates the capture and raises
// torch_accel.CaptureError saying that `what` cannot be captured, and why.
void refuse_capture(c10::DeviceIndex device, const char* what, const char* why);

// torch.accel.set_sync_debug_mode, as torch.cuda's: what a call that makes the calling thread
// wait for the accel stream's work does (0: nothing, 1: warn, 2: raise).
enum class SyncDebugMode : int { Disabled = 0, Warn = 1, Error = 2 };
SyncDebugMode sync_debug_mode();
void set_sync_debug_mode(SyncDebugMode mode);

// Called before `what` waits on the host for the stream (a blocking copy to or from the host,
// Tensor.item(), an operator whose result shape depends on the data, one accel runs on the
// calling thread): warns, or raises before anything ran, per the sync debug mode; `why` says
// why it waits. Explicit waits (synchronize(), Stream/Event.synchronize()) do not report, as
// on CUDA, and neither does the first call of an operator signature (accel's warm-up).
void warn_or_error_on_sync(const char* what, const char* why);

// While one lives, the calling thread reports no synchronizing call: an operator that reported
// its own wait (the CPU fallback) does not report each copy it makes through the host.
class QuietSyncs {
 public:
  QuietSyncs();
  ~QuietSyncs();
  QuietSyncs(const QuietSyncs&) = delete;
  QuietSyncs& operator=(const QuietSyncs&) = delete;

 private:
  bool was_;
};

// Enqueues f() on the current stream of `device`.
template <class F>
void launch(c10::DeviceIndex device, const char* what, F&& f) {
  require_host_accessible(what);
  // The worker runs it on its team: this thread's idle one would slow every kernel (see
  // rt::give_back_openmp_team; under ACCEL_LAUNCH_BLOCKING the task runs here, on this one).
  if (!rt::launch_blocking()) rt::give_back_openmp_team();
  device::call(
      [&] { rt::launch_host_func(rt::current_stream(device), rt::Task(std::forward<F>(f)), what); },
      what);
}

}  // namespace accel::aten
