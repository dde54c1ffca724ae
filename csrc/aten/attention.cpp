// scaled_dot_product_attention on accel picks its backend as the device underneath does.
//
// PyTorch asks a per-device dispatch stub which fused kernel suits the inputs; a device that
// registers nothing always gets the math path (matmul, softmax, matmul). On the host driver
// the CPU's choice applies: its flash attention kernel runs underlying on accel memory
// (_scaled_dot_product_flash_attention_for_cpu and its backward, see the yaml), and
// torch.nn.attention.sdpa_kernel selects backends as usual. On the cuda driver the choice is
// CUDA's (flash, memory-efficient, cuDNN), whose kernels run underlying as well.
#include <ATen/core/Tensor.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_cpu_dispatch.h>

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
    case Executor::Host:
      // The CPU's kernel, called directly as CPU tensors get it: not an operator call. Through
      // the dispatcher, tracing (torch.compile) would record the choice as a graph node
      // returning an int, which AOT autograd's partitioner refuses ("Expected
      // _fused_sdp_choice to be a tensor") where Inductor rewrites attention into
      // scaled_dot_product_attention. The rule reads metadata only.
      return at::cpu::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                        enable_gqa);
    case Executor::Cuda: break;
  }
  // CUDA's rule refuses tensors of other devices: the _fused_sdp_choice operator on accel
  // tensors runs it on their CUDA views (yaml). Under tracing this records a node (see above).
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale,
                               enable_gqa);
}

}  // namespace
}  // namespace accel::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &accel::aten::fused_sdp_choice)
}  // namespace at::native
