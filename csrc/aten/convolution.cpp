// Convolution. On backends other than CPU and CUDA, ATen routes convolutions to the
// "overrideable" operators; the forward runs the CPU convolution underlying (see the yaml), and
// the backward here becomes convolution_backward, also underlying, with the bias sizes the
// overrideable schema leaves out.
#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution_backward.h>

#include "AccelNativeFunctions.h"

namespace accel::aten {

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  // The bias has one value per output channel.
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  return at::convolution_backward(grad_output, input, weight, at::IntArrayRef(channels), stride,
                                  padding, dilation, transposed, output_padding, groups,
                                  output_mask);
}

}  // namespace accel::aten
