// Convolution. On backends other than CPU and CUDA, ATen routes convolutions to the
// "overrideable" operators; the forward runs the CPU convolution underlying (see the yaml), and
// the backward here becomes convolution_backward, also underlying, with the bias sizes the
// overrideable schema leaves out.
//
// The host driver runs the CPU's convolution_backward, whose oneDNN kernel writes past its
// workspace for one family of calls (uxlfoundation/oneDNN#6035, open; the CPU itself crashes or
// corrupts its heap in torch 2.11): the weight gradient of a float32 2-d convolution with a 1x1
// kernel and a stride above 1, channels-last input or weight, and fewer input channels per
// group than oneDNN's channel block (8 with AVX2, 16 with AVX-512; this takes 16). An image stem
// or a downsampling shortcut over few channels, in a channels-last model, is one: timm's fastvit
// under torch.compile crashed in its backward. Such calls run with contiguous tensors, which
// take oneDNN's blocked path, right results; accel's results are contiguous anyway (the yaml's
// contiguous_results).
//
// Depthwise 2-d convolutions with kernels of 5x5 and more (ConvNeXt's 7x7, EfficientNet's and
// MobileNetV3's 5x5) run forward and backward with channels-last arguments: oneDNN's
// channels-last kernels for them take 0.25x to 0.7x the time of its NCHW ones on this machine's
// CPU, conversions included (4 to 56 pixels square, float32 and bfloat16), and accel's
// contiguous results would otherwise keep a channels-last model (ConvNeXt's LayerNorm2d is a
// permute) in the slower NCHW path the CPU leaves after its first such layer. Other
// convolutions keep their arguments' layout: for 3x3 depthwise, 1x1 and dense kernels neither
// path wins everywhere (channels-last from 3x slower to 2.7x faster, by size).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/convolution_backward.h>

#include <algorithm>
#include <initializer_list>

#include "AccelNativeFunctions.h"

namespace accel::aten {
namespace {

// As ATen's convolution picks oneDNN's channels-last path: by the suggested format, which a 1x1
// weight keeps through its strides although it is contiguous too.
bool channels_last(const at::Tensor& t) {
  return t.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

// A depthwise 2-d convolution (one input channel per group) with a kernel of 5x5 or more, in a
// dtype oneDNN runs: see above.
bool depthwise_large_kernel(const at::Tensor& input, const at::Tensor& weight, bool transposed,
                            int64_t groups) {
  if (transposed || groups <= 1 || input.dim() != 4 || weight.dim() != 4) return false;
  if (input.scalar_type() != at::kFloat && input.scalar_type() != at::kBFloat16) return false;
  if (weight.size(1) != 1 || input.size(1) != groups) return false;
  return weight.size(2) >= 5 && weight.size(3) >= 5;
}

// Replaces the tensor arguments `indices` of the call on `stack` by channels-last copies (those
// that are not channels-last already).
void to_channels_last(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                      std::initializer_list<size_t> indices) {
  const size_t begin = stack->size() - op.schema().arguments().size();
  for (size_t i : indices) {
    const at::Tensor& t = (*stack)[begin + i].toTensor();
    if (!t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
      (*stack)[begin + i] = t.contiguous(at::MemoryFormat::ChannelsLast);
    }
  }
}

}  // namespace

bool convolution_channels_last_depthwise(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
  // output_padding, groups) and its out= form
  const size_t begin = stack->size() - op.schema().arguments().size();
  auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[begin + i]; };
  if (depthwise_large_kernel(arg(0).toTensor(), arg(1).toTensor(), arg(6).toBool(),
                             arg(8).toInt())) {
    to_channels_last(op, stack, {0, 1});
  }
  return false;  // the call runs as usual, with these tensors
}

bool convolution_backward_layout(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
  // transposed, output_padding, groups, output_mask) and its out= form, which adds three.
  const size_t n = op.schema().arguments().size();
  const size_t begin = stack->size() - n;
  auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[begin + i]; };
  const at::Tensor& input = arg(1).toTensor();
  const at::Tensor& weight = arg(2).toTensor();
  if (depthwise_large_kernel(input, weight, arg(7).toBool(), arg(9).toInt())) {
    to_channels_last(op, stack, {0, 1, 2});
    return false;
  }
  if (input.scalar_type() != at::kFloat || weight.dim() != 4 || arg(7).toBool()) return false;
  if (!arg(10).toBoolList().get(1)) return false;  // no weight gradient
  if (weight.size(2) != 1 || weight.size(3) != 1 || weight.size(1) >= 16) return false;
  const auto stride = arg(4).toIntVector();
  if (std::all_of(stride.begin(), stride.end(), [](int64_t s) { return s == 1; })) return false;
  if (!channels_last(input) && !channels_last(weight)) return false;
  for (size_t i : {0, 1, 2}) {
    const at::Tensor& t = arg(i).toTensor();
    if (channels_last(t) || !t.is_contiguous()) arg(i) = t.clone(at::MemoryFormat::Contiguous);
  }
  return false;  // the call runs as usual, with these tensors
}

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
