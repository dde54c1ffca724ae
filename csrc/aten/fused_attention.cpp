// accel::flash_attention and its backward: attention with O(seq) memory beyond inputs and
// outputs, (batch, heads, seq, head_dim), grouped-query (kv heads dividing q heads), returning
// the output and the log-sum-exp of each row (float32) that the backward reads.
//
// On the host driver (and for CPU tensors) it is ATen's CPU flash-attention kernel, which tiles
// the sequence and handles grouped-query heads itself, run underlying on the accel memory as a
// task on the current stream: measured against an own kernel, it is the faster (see
// benchmarks/fused_ops.py and the issue note). Other drivers have no kernel for it yet.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>

#include <tuple>

#include "AccelNativeFunctions.h"
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
  const at::ScalarType dt = q.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf, op,
                              ": dtype ", dt, " is not supported (float32, bfloat16, float16)");
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
    require_host_accessible(op);
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, bool causal,
                                                   std::optional<double> scale) {
  check("accel::flash_attention", q, k, v);
  return at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, std::nullopt, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& logsumexp, bool causal, std::optional<double> scale) {
  constexpr const char* op = "accel::flash_attention_backward";
  check(op, q, k, v);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && out.sizes() == q.sizes(), op,
              ": grad_out and out must have q's shape ", q.sizes(), ", got ", grad_out.sizes(),
              " and ", out.sizes());
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.to(q.scalar_type()), q, k, v, out, logsumexp, 0.0, causal, std::nullopt, scale);
}

}  // namespace accel::aten
