#include "aten/sparse.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_embedding_bag_backward_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "AccelNativeFunctions.h"
#include "aten/direct_call.h"
#include "aten/dispatch_util.h"

namespace accel::aten {
namespace {

at::SparseTensorImpl* coo(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.layout() == c10::kSparse);
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

at::SparseCsrTensorImpl* compressed(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.layout() != c10::kSparse && is_sparse_any(t));
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

}  // namespace

bool is_sparse_any(const at::Tensor& t) {
  switch (t.layout()) {
    case c10::kSparse:
    case c10::kSparseCsr:
    case c10::kSparseCsc:
    case c10::kSparseBsr:
    case c10::kSparseBsc: return true;
    default: return false;
  }
}

void assign_sparse(const at::Tensor& target, const at::Tensor& source, const DenseMap& map) {
  TORCH_CHECK(target.layout() == source.layout(), "accel: a kernel changed a sparse tensor's ",
              "layout from ", target.layout(), " to ", source.layout());
  if (target.layout() == c10::kSparse) {
    const at::SparseTensorImpl* from = coo(source);
    at::SparseTensorImpl* to = coo(target);
    to->raw_resize_(from->sparse_dim(), from->dense_dim(), source.sizes());
    to->set_indices_and_values_unsafe(map(from->indices()), map(from->values()));
    to->set_coalesced(from->coalesced());
    return;
  }
  const at::SparseCsrTensorImpl* from = compressed(source);
  compressed(target)->set_member_tensors(map(from->compressed_indices()),
                                         map(from->plain_indices()), map(from->values()),
                                         source.sizes());
}

at::Tensor sparse_on(const at::Tensor& t, c10::Device device, const DenseMap& map) {
  c10::OptionalDeviceGuard guard(device);
  // An empty sparse tensor of `device`, then t's structure. Built directly, not through
  // _sparse_compressed_tensor_unsafe: with invariant checks on
  // (torch.sparse.check_sparse_tensor_invariants) that validates, and a kernel's own result may
  // be valid for its device without meeting them (CSR @ CSR on the CPU leaves columns unsorted).
  const c10::DispatchKeySet keys(c10::computeDispatchKey(t.scalar_type(), t.layout(), device));
  at::Tensor out =
      t.layout() == c10::kSparse
          ? at::detail::make_tensor<at::SparseTensorImpl>(keys, t.dtype())
          : at::detail::make_tensor<at::SparseCsrTensorImpl>(keys, device, t.layout(), t.dtype());
  assign_sparse(out, t, map);
  return out;
}

at::Tensor _embedding_bag_backward(const at::Tensor& grad, const at::Tensor& indices,
                                   const at::Tensor& offsets, const at::Tensor& offset2bag,
                                   const at::Tensor& bag_size, const at::Tensor& maximum_indices,
                                   int64_t num_weights, bool scale_grad_by_freq, int64_t mode,
                                   bool sparse, const std::optional<at::Tensor>& per_sample_weights,
                                   int64_t padding_idx) {
  return at::native::_embedding_bag_backward_symint(
      grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
      scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx);
}

namespace {

// ATen's structural kernels that allocate members, under a guard for the tensor's device (the
// wrappers ATen generates for SparseCPU/SparseCUDA have one; the kernels themselves allocate on
// the current device).
at::Tensor empty_coo(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                     std::optional<at::Layout> layout, std::optional<at::Device> device,
                     std::optional<bool> pin, std::optional<at::MemoryFormat> format) {
  c10::OptionalDeviceGuard guard(device);
  return at::native::empty_sparse_symint(size, dtype, layout, device, pin, format);
}

at::Tensor empty_compressed(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                            std::optional<at::Layout> layout, std::optional<at::Device> device,
                            std::optional<bool> pin, std::optional<at::MemoryFormat> format) {
  c10::OptionalDeviceGuard guard(device);
  return at::native::empty_sparse_compressed_symint(size, dtype, layout, device, pin, format);
}

at::Tensor coo_with_dims(int64_t sparse_dim, int64_t dense_dim, at::IntArrayRef size,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin) {
  c10::OptionalDeviceGuard guard(device);
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype, layout, device, pin);
}

at::Tensor coo_with_dims_and_tensors(int64_t sparse_dim, int64_t dense_dim,
                                     c10::SymIntArrayRef size, const at::Tensor& indices,
                                     const at::Tensor& values, std::optional<at::ScalarType> dtype,
                                     std::optional<at::Layout> layout,
                                     std::optional<at::Device> device, std::optional<bool> pin,
                                     std::optional<bool> is_coalesced) {
  c10::OptionalDeviceGuard guard(device ? device : std::optional<at::Device>(values.device()));
  return at::native::new_with_dims_and_tensor_sparse_symint(
      sparse_dim, dense_dim, size, indices, values, dtype, layout, device, pin, is_coalesced);
}

const at::Tensor& resize_coo_(const at::Tensor& self, at::IntArrayRef size, int64_t sparse_dim,
                              int64_t dense_dim) {
  c10::DeviceGuard guard(self.device());
  return at::native::sparse_resize_(self, size, sparse_dim, dense_dim);
}

const at::Tensor& resize_and_clear_coo_(const at::Tensor& self, at::IntArrayRef size,
                                        int64_t sparse_dim, int64_t dense_dim) {
  c10::DeviceGuard guard(self.device());
  return at::native::sparse_resize_and_clear_(self, size, sparse_dim, dense_dim);
}

const at::Tensor& resize_compressed_(const at::Tensor& self, at::IntArrayRef size,
                                     std::optional<at::MemoryFormat> format) {
  c10::DeviceGuard guard(self.device());
  return at::native::resize_sparse_csr_(self, size, format);
}

}  // namespace

// ATen's device-independent kernels of the structural operators, as it registers them for
// SparseCPU, SparseCUDA and SparseMeta: they read or set the tensor's metadata and members only.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_coo));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(coo_with_dims));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(coo_with_dims_and_tensors));
  m.impl("sparse_resize_", TORCH_FN(resize_coo_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(resize_and_clear_coo_));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_compressed));
  m.impl("resize_", TORCH_FN(resize_compressed_));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
}

// The checks of sparse tensors' members (torch._validate_sparse_coo_tensor_args and its
// compressed twins) read the dense indices through CPU/CUDA dispatch stubs (flatten_indices):
// called through the dispatcher they run as the executor device's on the same memory.
// sparse_coo_tensor(..., check_invariants=True, is_coalesced=True) calls the COO one directly,
// past the dispatcher, and so fails with DispatchStub's "missing kernel for accel".
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"_validate_sparse_coo_tensor_args", "_validate_sparse_compressed_tensor_args",
        "_validate_sparse_csr_tensor_args", "_validate_sparse_csc_tensor_args",
        "_validate_sparse_bsr_tensor_args", "_validate_sparse_bsc_tensor_args"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&direct_call>());
  }
}

namespace {

// An operator on sparse accel tensors: its tensors on one device, as on CUDA (call_device:
// CPU tensors only as 0-dim scalars, one accel device), copies between devices excepted; then
// the executor device's kernel on the same memory.
void sparse_call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string& name = op.operator_name().name;
  if (name.find("copy") == std::string::npos) call_device(op, *stack, name);
  direct_call(op, stack);
}

// Every other operator ATen has a sparse CPU kernel for runs that kernel (or CUDA's) on the same
// memory: registered for each such operator, since a CompositeExplicitAutograd kernel (clone,
// copy_, sum, the pointwise operators) would otherwise take precedence over a fallback and treat
// the sparse tensor as a dense one. Operators with no sparse kernel on the CPU either reach the
// fallback, which gives the CPU's own error.

void register_sparse_kernels() {
  static const struct Registrations {
    torch::Library coo{torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1, __FILE__,
                       __LINE__};
    torch::Library compressed{torch::Library::IMPL, "aten", c10::DispatchKey::SparseCsrPrivateUse1,
                              __FILE__, __LINE__};
    Registrations() {
      auto& dispatcher = c10::Dispatcher::singleton();
      for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
        if (name.name.rfind("aten::", 0) != 0) continue;
        const std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
        if (!op) continue;
        const std::string local = op_name(*op).substr(6);  // without "aten::"
        if (op->hasKernelForDispatchKey(c10::DispatchKey::SparseCPU) &&
            !op->hasKernelForDispatchKey(c10::DispatchKey::SparsePrivateUse1)) {
          coo.impl(local.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_call>());
        }
        if (op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrCPU) &&
            !op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrPrivateUse1)) {
          compressed.impl(local.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_call>());
        }
      }
    }
  } registrations;
}

// After the static registrations above (same translation unit: initialized in order).
const bool g_registered = (register_sparse_kernels(), true);

}  // namespace

// sparse_coo_tensor(..., is_coalesced=True, check_invariants=True) and gradcheck of sparse
// inputs check that the indices are sorted and unique through at::sparse::flatten_indices, which
// calls a dispatch stub PyTorch fills for the CPU, CUDA and MPS only: for accel it is each
// nonzero's row-major position among the sparse sizes, sum_d indices[d] * stride_d, with accel's
// own operators.
namespace {
at::Tensor flatten_indices(const at::Tensor& indices, c10::IntArrayRef size) {
  const int64_t sparse_dim = indices.size(0);
  TORCH_CHECK(static_cast<int64_t>(size.size()) >= sparse_dim, "flatten_indices: ", sparse_dim,
              " sparse dimensions, but only ", size.size(), " sizes");
  at::Tensor flat = indices.select(0, sparse_dim - 1).clone();
  int64_t stride = 1;
  for (int64_t d = sparse_dim - 2; d >= 0; --d) {
    stride *= size[d + 1];
    flat.add_(indices.select(0, d), stride);
  }
  return flat;
}
}  // namespace

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_call>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_call>());
}

}  // namespace accel::aten

// The stub's declaration (ATen/native/sparse/SparseStubs.h, not among torch's installed
// headers), as ATen declares it.
namespace at::native {
using flatten_indices_fn = Tensor (*)(const Tensor& indices, IntArrayRef size);
DECLARE_DISPATCH(flatten_indices_fn, flatten_indices_stub)
REGISTER_PRIVATEUSE1_DISPATCH(flatten_indices_stub, &accel::aten::flatten_indices)
}  // namespace at::native
