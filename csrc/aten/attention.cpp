// scaled_dot_product_attention on accel picks its backend as the device underneath does.
//
// PyTorch asks a per-device dispatch stub which fused kernel suits the inputs; a device that
// registers nothing always gets the math path (matmul, softmax, matmul). On the host driver
// the CPU's choice applies: its flash attention kernel runs underlying on accel memory
// (_scaled_dot_product_flash_attention_for_cpu and its backward, see the yaml), and
// torch.nn.attention.sdpa_kernel selects backends as usual. On the cuda driver the choice is
// CUDA's (flash, memory-efficient, cuDNN), whose kernels run underlying as well.
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include "AccelNativeFunctions.h"
#include "aten/executor.h"
#include "device/common.h"

namespace accel::aten {
namespace {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  switch (executor()) {
    case Executor::None:  // the fused kernels cannot run on accel memory
      return static_cast<int64_t>(sdp::SDPBackend::math);
    case Executor::Host: {
      // The CPU's kernel, called directly as CPU tensors get it: not an operator call. Through
      // the dispatcher, tracing (torch.compile) would record the choice as a graph node
      // returning an int, which AOT autograd's partitioner refuses ("Expected
      // _fused_sdp_choice to be a tensor") where Inductor rewrites attention into
      // scaled_dot_product_attention. The rule reads metadata only.
      // The rule lets the CPU's tensors alone give masks whose last dimension is strided (the
      // CPU's flash kernel reads them as they are) and sends other devices' to the math path:
      // accel's host executor runs that kernel too, so such a mask is judged as the CPU's is,
      // through a meta stand-in of its sizes and dtype.
      std::optional<at::Tensor> mask = attn_mask;
      if (mask && mask->defined() && mask->dim() > 0 && mask->stride(-1) != 1) {
        // (Made without the dispatcher: tracing would record it.)
        mask = at::detail::empty_meta(mask->sizes(), mask->scalar_type(), std::nullopt,
                                      std::nullopt, std::nullopt, std::nullopt);
      }
      return at::cpu::_fused_sdp_choice(query, key, value, mask, dropout_p, is_causal, scale,
                                        enable_gqa);
    }
    case Executor::Cuda: break;
  }
  // CUDA's rule refuses tensors of other devices: the _fused_sdp_choice operator on accel
  // tensors runs it on their CUDA views (yaml). Under tracing this records a node (see above).
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale,
                               enable_gqa);
}

// {B, H, L, D} with the strides of a contiguous {B, L, H, D}: how the CPU's flash kernels lay
// out what they write.
at::Tensor heads_second(const at::Tensor& like) {
  return at::empty({like.size(0), like.size(2), like.size(1), like.size(3)}, like.options())
      .transpose(1, 2);
}

}  // namespace

// The result metadata of the CPU's flash attention and its backward (yaml `meta`), on meta
// tensors, with the kernel's own argument checks and its layouts (aten/src/ATen/native/
// transformers/attention.cpp): PyTorch's meta functions for them are Python, tens of
// microseconds, and describe the output otherwise (empty_like the query for any layout), so a
// new sequence length ran the kernel on the caller and waited for the stream (a decoder's
// every step). A check that fails here sends the call to the kernel on the caller, which raises
// its own error. Calls through scaled_dot_product_attention have passed the CPU's backend
// choice, which checks the shapes the kernel relies on (batch, heads, sequence lengths).
void sdpa_flash_cpu_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 7;  // query, key, value, dropout_p, is_causal, attn_mask, scale
  const at::Tensor q = torch::jit::peek(*stack, 0, n).toTensor();
  const at::Tensor k = torch::jit::peek(*stack, 1, n).toTensor();
  const at::Tensor v = torch::jit::peek(*stack, 2, n).toTensor();
  const double dropout_p = torch::jit::peek(*stack, 3, n).toDouble();
  const std::optional<at::Tensor> mask = torch::jit::peek(*stack, 5, n).toOptional<at::Tensor>();
  const c10::ScalarType dtype = q.scalar_type();
  constexpr const char* what = "scaled_dot_product_attention_flash_attention: ";
  TORCH_CHECK(c10::isFloatingType(dtype), what,
              "Expected data type in FP32, FP64, BF16, FP16, but got ", dtype, " instead.");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, what,
              "Accept only 4 dims inputs shape of {B, H, T, K}");
  TORCH_CHECK(dropout_p == 0.0, what, "Currently do not support dropout > 0");
  TORCH_CHECK(q.size(3) == v.size(3) && k.size(3) == v.size(3), what,
              "Q/K/V should have the same head size");
  TORCH_CHECK(!mask || mask->scalar_type() == at::kFloat || mask->scalar_type() == dtype, what,
              "Attention mask is the same data type as query");
  TORCH_CHECK(!mask || mask->dim() == 2 || mask->dim() == 4, what, "Attention mask dim in {2, 4}");
  at::Tensor output = at::empty_like(q);
  at::Tensor logsumexp =
      at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::toOpMathType(dtype)))
          .transpose(1, 2);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(output), std::move(logsumexp));
}

void sdpa_flash_cpu_backward_meta(torch::jit::Stack* stack) {
  // grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale
  constexpr size_t n = 10;
  const c10::IValue& grad_out = torch::jit::peek(*stack, 0, n);
  at::Tensor gq, gk, gv;  // undefined without a gradient, as the kernel returns them
  if (grad_out.isTensor() && grad_out.toTensor().defined()) {
    const at::Tensor q = torch::jit::peek(*stack, 1, n).toTensor();
    const at::Tensor k = torch::jit::peek(*stack, 2, n).toTensor();
    const at::Tensor v = torch::jit::peek(*stack, 3, n).toTensor();
    // Other calls go to the kernel on the caller, which raises its own error.
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "4-d query, key and value");
    gq = heads_second(q);
    gk = heads_second(k);
    gv = heads_second(v);
  }
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(gq), std::move(gk), std::move(gv));
}

}  // namespace accel::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &accel::aten::fused_sdp_choice)
}  // namespace at::native
