// Accel tensors for the results of an executor's kernel (executor.h): allocated from accel's
// allocator, laid out as the kernel's, filled from the host or device to device.
#pragma once

#include <ATen/core/Tensor.h>

#include "aten/meta_cache.h"

namespace accel::aten {

// A new accel tensor on the current device (the caller's guard selects it).
at::Tensor allocate(const TensorMeta& m);

// Gives the accel tensor `t` the sizes and strides `m` describes (an out= tensor the kernel
// resizes), growing its storage if needed.
void adopt_layout(const at::Tensor& t, const TensorMeta& m);

// Copies the bytes of `src`, a result of the executor's kernel laid out as `dst`, into the accel
// tensor `dst`: from the host (waiting), or device to device in stream order (cuda).
void write_result(const at::Tensor& dst, const at::Tensor& src, const char* what);

// An accel tensor over `storage` (accel memory) laid out as `like`, a kernel's result over the
// same memory: its dtype, sizes, strides, offset, conjugate and negative bits. `view`: a view's
// impl (with autograd's keys), as ATen's view kernels make.
at::Tensor accel_tensor_over(c10::Storage storage, const at::Tensor& like, bool view = false);

// An accel copy of a result of the executor's kernel (its layout where it is dense:
// channels-last stays so).
at::Tensor to_accel(const at::Tensor& r, const char* what);

}  // namespace accel::aten
