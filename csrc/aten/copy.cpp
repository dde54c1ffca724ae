// Copies between the host and accel devices, within and across devices, with broadcasting and
// dtype conversion; fill_, zero_ and _local_scalar_dense (Tensor.item()).
//
// Fast path: when both sides have the same dtype and the same dense memory layout, one runtime
// memcpy on the current stream moves the bytes. Otherwise the conversion runs as a CPU kernel:
// on the host side for host<->device copies, and as a stream task over device memory for copies
// within accel (the host driver's device memory is host memory).
//
// Blocking behaviour follows CUDA: with non_blocking=False a copy has completed when copy_
// returns; with non_blocking=True a copy from or to pinned memory is only enqueued.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/resize.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Scalar.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include "AccelNativeFunctions.h"
#include "aten/executor.h"
#include "aten/fallback.h"
#include "aten/host_task.h"
#include "aten/underlying_task.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

bool is_accel(const at::Tensor& t) {
  return t.device().type() == kAccel;
}

// Same dtype, same lazy bits and the same dense memory layout: the bytes can be copied as is.
bool same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.is_conj() != b.is_conj() ||
      a.is_neg() != b.is_neg()) {
    return false;
  }
  if (a.is_contiguous() && b.is_contiguous()) return true;
  return a.is_non_overlapping_and_dense() && b.is_non_overlapping_and_dense() &&
         a.strides() == b.strides();
}

size_t nbytes_of(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.itemsize();
}

// A new tensor with the dtype, lazy bits and dense layout of `like` (dense `like` only), made
// with `options` (device, pinning): the bytes of one copy into the other as they are.
at::Tensor empty_with_layout_of(const at::Tensor& like, at::TensorOptions options) {
  at::Tensor t = at::empty_strided(like.sizes(), like.strides(), options.dtype(like.scalar_type()));
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

// A CPU tensor with the dtype, lazy bits and dense layout of `like` (dense `like` only).
at::Tensor cpu_like(const at::Tensor& like, bool pinned = false) {
  return empty_with_layout_of(like, at::TensorOptions().pinned_memory(pinned));
}

// An accel tensor on `device` with the dtype and lazy bits of `like`, contiguous.
at::Tensor accel_contiguous_like(const at::Tensor& like, c10::DeviceIndex device) {
  at::Tensor t =
      at::empty(like.sizes(), at::TensorOptions().dtype(like.scalar_type()).device(kAccel, device));
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

void memcpy_on(rt::Stream stream, void* dst, const void* src, size_t bytes, rt::CopyKind kind,
               const char* what) {
  device::call([&] { rt::memcpy_async(dst, src, bytes, kind, stream); }, what);
}

void synchronize(rt::Stream stream) {
  device::call([&] { rt::stream_synchronize(stream); }, "copy_");
}

// Without an executor (a driver with no kernels for ATen): the bytes `t` spans go to the host,
// viewed there with t's layout; put_back uploads them again.
class HostImage {
 public:
  HostImage(const at::Tensor& t, rt::Stream stream) : t_(t), stream_(stream) {
    int64_t lo = t.storage_offset(), hi = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      const int64_t reach = (t.size(d) - 1) * t.stride(d);
      (reach < 0 ? lo : hi) += reach;
    }
    const int64_t item = static_cast<int64_t>(t.itemsize());
    start_ = static_cast<size_t>(lo * item);
    buffer_ = at::empty({(hi - lo + 1) * item}, at::TensorOptions().dtype(at::kByte));
    memcpy_on(stream, buffer_.data_ptr(), static_cast<const char*>(t.storage().data()) + start_,
              buffer_.numel(), rt::CopyKind::DeviceToHost, "copy_");
    synchronize(stream);
    view_ =
        buffer_.view(t.scalar_type()).as_strided(t.sizes(), t.strides(), t.storage_offset() - lo);
    if (t.is_conj()) view_._set_conj(true);
    if (t.is_neg()) view_._set_neg(true);
  }
  const at::Tensor& view() const { return view_; }
  void put_back() {
    memcpy_on(stream_, static_cast<char*>(t_.storage().mutable_data()) + start_, buffer_.data_ptr(),
              buffer_.numel(), rt::CopyKind::HostToDevice, "copy_");
    synchronize(stream_);
  }

 private:
  at::Tensor t_;
  rt::Stream stream_;
  size_t start_ = 0;
  at::Tensor buffer_, view_;
};

// CUDA checks a copy's and a fill's dtypes, and a fill value's range, on the host before it
// launches a kernel, so that `x.to(torch.uint1)` or `fill_(300)` on uint8 raise at the call.
// The host executor's kernels are ATen's CPU kernels, which check as they run, on the stream's
// worker: their errors would come at the next synchronization as a failed task, the wrong
// type and far from their cause. So the CPU kernel first checks the arguments on the caller,
// on a tensor of a few elements: once per pair of dtypes for a copy, and for a fill whenever
// the dtype and value are not among the last few this thread checked.
// The CPU's copy of a 2x2 tensor of `from` into one of `to`: raises its error where it refuses.
void probe_cpu_copy(c10::ScalarType to, c10::ScalarType from) {
  const NotAnOperator quiet;  // the check is not an operator the program ran
  at::Tensor source = at::empty({2, 2}, at::TensorOptions().dtype(from));
  std::memset(source.mutable_data_ptr(), 0, source.nbytes());
  // Equal dtypes come here in different layouts: transposed, the CPU's copy runs its kernel
  // rather than a memcpy.
  at::empty({2, 2}, at::TensorOptions().dtype(to)).copy_(to == from ? source.t() : source);
}

void check_conversion_on_caller(c10::ScalarType to, c10::ScalarType from) {
  constexpr size_t n = static_cast<size_t>(c10::ScalarType::NumOptions);
  static std::array<std::atomic<bool>, n * n> passed{};
  std::atomic<bool>& seen = passed[static_cast<size_t>(to) * n + static_cast<size_t>(from)];
  if (seen.load(std::memory_order_relaxed)) return;
  probe_cpu_copy(to, from);
  seen.store(true, std::memory_order_relaxed);
}

void check_fill_on_caller(c10::ScalarType dtype, const c10::Scalar& value) {
  struct Checked {
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    c10::ScalarType kind = c10::ScalarType::Undefined;
    std::array<double, 2> number{};
    int64_t integer = 0;
  };
  Checked key;
  key.dtype = dtype;
  if (!value.isSymbolic()) {
    key.kind = value.type();
    if (value.isComplex()) {
      const c10::complex<double> z = value.toComplexDouble();
      key.number = {z.real(), z.imag()};
    } else if (value.isFloatingPoint()) {
      key.number[0] = value.toDouble();
    } else if (value.isBoolean()) {
      key.integer = value.toBool();
    } else if (key.kind == c10::ScalarType::UInt64) {
      key.integer = static_cast<int64_t>(value.toUInt64());
    } else {
      key.integer = value.toLong();
    }
  }
  const auto same = [&](const Checked& c) {
    return c.dtype == key.dtype && c.kind == key.kind && c.integer == key.integer &&
           std::memcmp(c.number.data(), key.number.data(), sizeof(key.number)) == 0;
  };
  thread_local std::array<Checked, 4> recent;
  thread_local size_t next = 0;
  const bool cacheable = key.kind != c10::ScalarType::Undefined;
  if (cacheable && std::any_of(recent.begin(), recent.end(), same)) return;
  const NotAnOperator quiet;
  at::empty({2}, at::TensorOptions().dtype(dtype)).fill_(value);
  if (cacheable) recent[next++ % recent.size()] = key;
}

// dst and src on accel devices (possibly different ones). Runs on dst's current stream.
void copy_within_accel(const at::Tensor& dst, const at::Tensor& src) {
  const c10::DeviceIndex dst_dev = dst.device().index();
  const c10::DeviceIndex src_dev = src.device().index();
  c10::DeviceGuard guard(dst.device());
  const rt::Stream stream = device::call([&] { return rt::current_stream(dst_dev); });
  rt::Stream src_stream = stream;
  if (src_dev != dst_dev) {
    // Order the copy after the work queued on the source device, and work later queued there
    // after the copy (so the source cannot be freed and reused while it is read).
    src_stream = device::call([&] { return rt::current_stream(src_dev); });
    device::call([&] {
      const rt::Event ready = rt::event_create(src_dev);
      rt::event_record(ready, src_stream);
      rt::stream_wait_event(stream, ready);
      rt::event_destroy(ready);
    });
  }
  if (same_bytes(dst, src)) {
    memcpy_on(stream, dst.data_ptr(), src.const_data_ptr(), nbytes_of(dst),
              rt::CopyKind::DeviceToDevice, "copy_");
  } else if (executor() == Executor::None) {
    host_round_trip("aten::copy_", dst_dev);
    const HostImage from(src, stream);
    HostImage to(dst, stream);
    to.view().copy_(from.view());
    to.put_back();
  } else {
    if (executor() == Executor::Host)
      check_conversion_on_caller(dst.scalar_type(), src.scalar_type());
    // A source on another GPU is viewed on its own device (CUDA's copy then goes peer to peer).
    launch_kernel(dst_dev, "copy_",
                  [d = Layout::of(dst), s = Layout::of(src, /*write=*/false),
                   other = src_dev != dst_dev ? kernel_device(src_dev)
                                              : c10::Device(c10::kCPU)](KernelStorages& views) {
                    const bool apart = other != views.device() && !other.is_cpu();
                    d.view(views).copy_(apart ? s.view_on(other) : s.view(views));
                  });
  }
  if (src_dev != dst_dev) {
    device::call([&] {
      const rt::Event done = rt::event_create(dst_dev);
      rt::event_record(done, stream);
      rt::stream_wait_event(src_stream, done);
      rt::event_destroy(done);
    });
  }
}

void copy_host_to_accel(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  // As CUDA's: a blocking copy reports; a non-blocking one from pageable memory waits too (the
  // bytes must be read before the call returns) but does not.
  if (!non_blocking) warn_or_error_on_sync("copy_ (host to accel)", "a blocking copy");
  c10::DeviceGuard guard(dst.device());
  const rt::Stream stream = device::call([&] { return rt::current_stream(dst.device().index()); });
  if (non_blocking && !same_bytes(dst, src) && src.is_non_overlapping_and_dense()) {
    // A non-blocking copy that converts (dtype, layout, conjugate or negative bits) converts on
    // the device, as CUDA's does: src's bytes go up as they are, in stream order, and a copy
    // within accel converts them. Converting on the host would read a pinned source before the
    // work queued to write it (a non-blocking download into it) has run.
    at::Tensor staged = empty_with_layout_of(src, at::TensorOptions().device(dst.device()));
    copy_host_to_accel(staged, src, /*non_blocking=*/true);
    copy_within_accel(dst, staged);
    return;
  }
  at::Tensor host = src;
  if (!same_bytes(dst, src) && dst.is_non_overlapping_and_dense()) {
    // Convert on the host into dst's exact byte layout, then move the bytes.
    host = cpu_like(dst);
    host.copy_(src);
  }
  if (same_bytes(dst, host)) {
    memcpy_on(stream, dst.data_ptr(), host.const_data_ptr(), nbytes_of(dst),
              rt::CopyKind::HostToDevice, "copy_");
    // (const: a copy-on-write source stays shared)
    void* data = const_cast<void*>(host.const_data_ptr());
    const bool pinned = rt::is_pinned(data);
    if (pinned) device::call([&] { rt::host_record_stream(data, stream); });
    if (!non_blocking || !pinned) synchronize(stream);
    return;
  }
  // dst has gaps (a slice): upload contiguously, then scatter on the device.
  at::Tensor staged = accel_contiguous_like(dst, dst.device().index());
  copy_host_to_accel(staged, src.contiguous(), /*non_blocking=*/true);
  copy_within_accel(dst, staged);
  if (!non_blocking) synchronize(stream);
}

void copy_accel_to_host(const at::Tensor& dst, const at::Tensor& src, bool non_blocking) {
  if (!non_blocking) warn_or_error_on_sync("copy_ (accel to host)", "a blocking copy");
  c10::DeviceGuard guard(src.device());
  const rt::Stream stream = device::call([&] { return rt::current_stream(src.device().index()); });
  if (same_bytes(dst, src)) {
    const bool pinned = rt::is_pinned(dst.data_ptr());
    memcpy_on(stream, dst.data_ptr(), src.const_data_ptr(), nbytes_of(dst),
              rt::CopyKind::DeviceToHost, "copy_");
    if (pinned) device::call([&] { rt::host_record_stream(dst.data_ptr(), stream); });
    if (!non_blocking || !pinned) synchronize(stream);
    return;
  }
  if (non_blocking && dst.is_non_overlapping_and_dense()) {
    // As CUDA's: converted on the device first, in stream order, then downloaded as it is (not
    // waiting where dst is pinned).
    at::Tensor converted = empty_with_layout_of(dst, at::TensorOptions().device(src.device()));
    copy_within_accel(converted, src);
    copy_accel_to_host(dst, converted, /*non_blocking=*/true);
    return;
  }
  // Download src's bytes as they are (gathering first if src has gaps), convert on the host.
  at::Tensor dense = src;
  if (!src.is_non_overlapping_and_dense()) {
    dense = accel_contiguous_like(src, src.device().index());
    copy_within_accel(dense, src);
  }
  at::Tensor host = cpu_like(dense);
  memcpy_on(stream, host.data_ptr(), dense.const_data_ptr(), nbytes_of(dense),
            rt::CopyKind::DeviceToHost, "copy_");
  synchronize(stream);
  dst.copy_(host);
}

// Between accel memory and a CUDA tensor of the same GPU (cuda driver): one device-to-device
// copy on the accel stream, after the work queued on PyTorch's current CUDA stream and before the
// work queued there later; the CUDA tensor's memory is marked as used by the accel stream.
void copy_with_torch_cuda(const at::Tensor& dst, const at::Tensor& src) {
  const bool into_accel = is_accel(dst);
  const at::Tensor& accel = into_accel ? dst : src;
  const at::Tensor& cuda = into_accel ? src : dst;
  const c10::DeviceIndex device = accel.device().index();
  TORCH_CHECK(executor() == Executor::Cuda, "copy_: accel tensors on the ", rt::driver_name(),
              " driver cannot be copied to or from ", cuda.device(),
              " tensors directly; copy through the CPU (.cpu())");
  TORCH_CHECK(cuda.device().index() == device, "copy_: ", accel.device(), " and ", cuda.device(),
              " are different GPUs; copy to accel:", static_cast<int>(cuda.device().index()),
              " first");
  c10::DeviceGuard guard(accel.device());
  accel_stream_waits_for_torch_cuda(device);
  {
    KernelScope scope(device);  // PyTorch's current CUDA stream is the accel stream here
    const at::Tensor view = Layout::of(accel, into_accel).view_on(kernel_device(device));
    if (into_accel) {
      view.copy_(src);
    } else {
      dst.copy_(view);
    }
    const c10::Device gpu(c10::kCUDA, device);
    cuda.record_stream(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(gpu));
  }
  torch_cuda_waits_for_accel_stream(device);
}

}  // namespace

bool cpu_copy_takes(c10::ScalarType dtype) {
  constexpr size_t n = static_cast<size_t>(c10::ScalarType::NumOptions);
  static std::array<std::atomic<int8_t>, n> known{};  // 0: not probed, 1: takes, 2: refuses
  std::atomic<int8_t>& k = known[static_cast<size_t>(dtype)];
  int8_t v = k.load(std::memory_order_relaxed);
  if (v == 0) {
    try {
      probe_cpu_copy(dtype, dtype);
      v = 1;
    } catch (const c10::Error&) {
      v = 2;
    }
    k.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  TORCH_CHECK(self.defined() && src.defined(), "copy_: undefined tensor");
  // ATen's ZeroTensor fallback lets copy_ through: a zero tensor (forward-mode AD's zero tangent)
  // has no memory to copy from, or to write.
  TORCH_CHECK(!self._is_zerotensor(),
              "ZeroTensors are immutable. Please materialize the tensor "
              "using `.clone()`, if you want a mutable zero tensor.");
  if (src._is_zerotensor()) return self.zero_();
  if ((is_accel(self) && src.is_cuda()) || (self.is_cuda() && is_accel(src))) {
    copy_with_torch_cuda(self, src);
    return self;
  }
  TORCH_CHECK(is_accel(self) || self.device().is_cpu(), "copy_: accel cannot copy into a ",
              self.device(), " tensor");
  TORCH_CHECK(is_accel(src) || src.device().is_cpu(), "copy_: accel cannot copy from a ",
              src.device(), " tensor");
  TORCH_CHECK(self.layout() == c10::Layout::Strided && src.layout() == c10::Layout::Strided,
              "copy_: accel copies dense (strided) tensors only");
  if (self.is_same(src)) return self;
  // src must broadcast to self's shape, also when self is empty (as on the CPU).
  if (!src.sizes().equals(self.sizes())) {
    const c10::DimVector shape = at::infer_size_dimvector(self.sizes(), src.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape).equals(self.sizes()), "output with shape ", self.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (self.numel() == 0) return self;
  // A view of exactly the same data: nothing to do (as on the CPU).
  if (self.is_alias_of(src) && self.storage_offset() == src.storage_offset() &&
      self.sizes().equals(src.sizes()) && self.strides().equals(src.strides()) &&
      self.scalar_type() == src.scalar_type() && self.is_conj() == src.is_conj() &&
      self.is_neg() == src.is_neg()) {
    return self;
  }
  at::assert_no_internal_overlap(self);
  // Like the CPU and CUDA, refuse a source that partly overlaps the destination
  // (x[1:].copy_(x[:-1])): the result would depend on the order elements are written in.
  at::assert_no_partial_overlap(self, src);
  const at::Tensor source = src.sizes() == self.sizes() ? src : src.expand_as(self);
  if (is_accel(self) && is_accel(source)) {
    copy_within_accel(self, source);
    if (!non_blocking) {
      // A device-to-device copy is ordered like any kernel; nothing to wait for on the host.
    }
  } else if (is_accel(self)) {
    copy_host_to_accel(self, source, non_blocking);
  } else {
    copy_accel_to_host(self, source, non_blocking);
  }
  return self;
}

at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy_(out, self, non_blocking);
  return out;
}

at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  at::Tensor out = dst;
  return copy_(out, self, /*non_blocking=*/false);
}

at::Tensor& fill_Scalar(at::Tensor& self, const c10::Scalar& value) {
  // Overlapping elements (an expanded tensor) all get the same value: accepted, as on CUDA.
  if (self.numel() == 0) return self;
  c10::DeviceGuard guard(self.device());
  if (executor() == Executor::None) {
    const c10::DeviceIndex device = self.device().index();
    host_round_trip("aten::fill_", device);
    HostImage image(self, device::call([&] { return rt::current_stream(device); }));
    image.view().fill_(value);
    image.put_back();
    return self;
  }
  if (executor() == Executor::Host) check_fill_on_caller(self.scalar_type(), value);
  launch_kernel(
      self.device().index(), "fill_",
      [l = Layout::of(self), value](KernelStorages& views) { l.view(views).fill_(value); });
  return self;
}

at::Tensor& fill_Tensor(at::Tensor& self, const at::Tensor& value) {
  TORCH_CHECK(value.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ",
              value.dim(), " dimensions.");
  return fill_Scalar(self, value.item());
}

at::Tensor& zero_(at::Tensor& self) {
  if (self.numel() == 0) return self;
  if (self.is_non_overlapping_and_dense()) {
    c10::DeviceGuard guard(self.device());
    const rt::Stream stream =
        device::call([&] { return rt::current_stream(self.device().index()); });
    device::call([&] { rt::memset_async(self.data_ptr(), 0, nbytes_of(self), stream); }, "zero_");
    return self;
  }
  return fill_Scalar(self, 0);
}

c10::Scalar _local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  warn_or_error_on_sync("Tensor.item() (aten::_local_scalar_dense)",
                        "it reads a value on the host");
  c10::DeviceGuard guard(self.device());
  at::Tensor host = cpu_like(self.is_non_overlapping_and_dense() ? self : self.contiguous());
  const rt::Stream stream = device::call([&] { return rt::current_stream(self.device().index()); });
  // Reading a value on the host waits for the stream; during graph capture that is an error
  // the runtime reports, named here after the user-facing call.
  device::call(
      [&] {
        rt::memcpy_async(host.data_ptr(), self.const_data_ptr(), self.itemsize(),
                         rt::CopyKind::DeviceToHost, stream);
      },
      "Tensor.item() (aten::_local_scalar_dense)");
  return at::_local_scalar_dense(host);
}

}  // namespace accel::aten
