// accel::flash_attention and its backward: attention with O(seq) memory beyond inputs and
// outputs, (batch, heads, seq, head_dim), grouped-query (kv heads dividing q heads), returning
// the output and the log-sum-exp of each row (float32) that the backward reads.
//
// On the host driver (and for CPU tensors) it is ATen's CPU flash-attention kernel, which tiles
// the sequence and handles grouped-query heads itself, run underlying on the accel memory as a
// task on the current stream (no own host kernel: ATen's is vectorized and threaded over batch
// and heads already). On the cuda driver it is accel's Triton kernel (torch_accel/kernels/
// attention.py) on the accel stream. Results are contiguous on every driver.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>

#include <torch/library.h>

#include <tuple>

#include "AccelNativeFunctions.h"
#include "aten/fused_cuda.h"
#include "aten/fused_util.h"
#include "aten/host_task.h"
#include "device/common.h"

namespace accel::aten {
namespace {

void check(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}}) {
    TORCH_CHECK(t->device() == q.device(), op, ": ", name, " is on ", t->device(),
                ", expected it on ", q.device(), " like q");
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), op, ": ", name, " has dtype ",
                t->scalar_type(), " but q has ", q.scalar_type());
  }
  (void)kernel_dtype(op, "q", q);  // the dtypes the kernels take
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": q, k and v must be (batch, heads, seq, head_dim), got ", q.sizes(), ", ",
              k.sizes(), " and ", v.sizes());
  TORCH_CHECK(k.sizes() == v.sizes(), op, ": k and v must have one shape, got ", k.sizes(), " and ",
              v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3), op,
              ": q and k must agree in batch and head_dim, got ", q.sizes(), " and ", k.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, op, ": the kv heads (", k.size(1),
              ") must divide the q heads (", q.size(1), ")");
  if (!q.is_cpu()) {
    TORCH_CHECK(q.device().type() == device::kAccel, op, ": expected accel or CPU tensors, got ",
                q.device());
    if (!fused_on_cuda()) require_host_accessible(op);
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, bool causal,
                                                   std::optional<double> scale) {
  check("accel::flash_attention", q, k, v);
  if (!q.is_cpu() && fused_on_cuda()) {
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    call_cuda_impl(q.device().index(), "accel::_flash_attention_cuda",
                   {q, k, v, causal, scale, out, lse});
    return {out, lse};
  }
  auto [out, lse] =
      at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, scale);
  return {out.contiguous(), lse.contiguous()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& logsumexp, bool causal, std::optional<double> scale) {
  constexpr const char* op = "accel::flash_attention_backward";
  check(op, q, k, v);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && out.sizes() == q.sizes(), op,
              ": grad_out and out must have q's shape ", q.sizes(), ", got ", grad_out.sizes(),
              " and ", out.sizes());
  if (!q.is_cpu() && fused_on_cuda()) {
    at::Tensor gq = at::empty(q.sizes(), q.options());
    at::Tensor gk = at::empty(k.sizes(), k.options());
    at::Tensor gv = at::empty(v.sizes(), v.options());
    call_cuda_impl(
        q.device().index(), "accel::_flash_attention_backward_cuda",
        {grad_out.to(q.scalar_type()), q, k, v, out, logsumexp, causal, scale, gq, gk, gv});
    return {gq, gk, gv};
  }
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.to(q.scalar_type()), q, k, v, out, logsumexp, 0.0, causal, std::nullopt, scale);
  return {gq.contiguous(), gk.contiguous(), gv.contiguous()};
}

namespace {

// Autocast: attention runs in autocast's lower precision, as scaled_dot_product_attention.
std::tuple<at::Tensor, at::Tensor> flash_attention_autocast(const at::Tensor& q,
                                                            const at::Tensor& k,
                                                            const at::Tensor& v, bool causal,
                                                            std::optional<double> scale) {
  const AutocastLowerPrecision lower;
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("accel::flash_attention", "")
                             .typed<decltype(flash_attention)>();
  return op.call(lower(q), lower(k), lower(v), causal, scale);
}

TORCH_LIBRARY_IMPL(accel, AutocastPrivateUse1, m) {
  m.impl("flash_attention", TORCH_FN(flash_attention_autocast));
}

}  // namespace
}  // namespace accel::aten
