// Sparse accel tensors: ATen's sparse tensor types (COO, and compressed: CSR, CSC, BSR, BSC)
// whose member tensors (indices, values) are dense accel tensors, as SparseCUDA's are CUDA
// tensors. Structural operators (construction, sizes, member access, resizing) are ATen's own
// device-independent kernels, registered for the accel sparse keys (sparse.cpp); every other
// operator runs the executor device's sparse kernel on sparse tensors of that device over the
// same member memory (direct_call.cpp), which these conversions build.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace accel::aten {

using DenseMap = std::function<at::Tensor(const at::Tensor&)>;

// Whether `t` has a sparse layout (COO or compressed).
bool is_sparse_any(const at::Tensor& t);

// A sparse tensor of `device` with the sizes, layout and flags of `t`, whose member tensors are
// `map` of t's.
at::Tensor sparse_on(const at::Tensor& t, c10::Device device, const DenseMap& map);

// Makes the sparse tensor `target` what `source` (the tensor an in-place kernel ran on instead
// of it) now is: sizes, dims, flags, and `map` of its member tensors.
void assign_sparse(const at::Tensor& target, const at::Tensor& source, const DenseMap& map);

}  // namespace accel::aten
