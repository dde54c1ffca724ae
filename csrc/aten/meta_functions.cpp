// accel's C++ meta functions (yaml `meta:`) of operators that PyTorch gives no structured meta
// function, among those a training step or a decoding step calls at every new sequence length:
// layer norm and its backward, where, masked_fill (and in place), index_select (embedding),
// embedding's backward, dropout's backward, constant padding, the softmax of SDPA's math path,
// bernoulli_ and exponential_, convolution, batch norm and its backward, relu.
//
// Each computes the results on meta tensors exactly as the CPU kernel lays them out, after the
// argument checks that kernel makes before it reads any data, with its error messages. The
// underlying tier then runs a signature's first call straight into accel memory, and new shapes
// of a family that ran without an error do not wait for the stream (csrc/aten/underlying.cpp).
// PyTorch's own meta functions (Python, most of them) may lay results out otherwise than the CPU
// kernel and skip some of its checks, which is why they do not serve here. Where the CPU kernel
// is composite (constant_pad_nd, native_dropout_backward, _safe_softmax, relu), the meta function
// is that kernel's own code run on meta tensors: its inner operators have C++ meta functions of
// their own. test/test_meta_functions.py compares every one with the CPU kernel's results and
// errors.
#include <ATen/Dispatch.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/TensorIterator.h>
#include <ATen/TensorUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/native/RangeUtils.h>
#include <ATen/native/cpu/mixed_data_type.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/_convolution.h>
#include <ATen/ops/_safe_softmax_native.h>
#include <ATen/ops/constant_pad_nd_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/native_dropout_backward_native.h>
#include <ATen/ops/relu_native.h>
#include <ATen/ops/result_type.h>
#include <c10/util/irange.h>

#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "AccelNativeFunctions.h"
#include "aten/dispatch_util.h"
#include "aten/meta_functions.h"

namespace accel::aten {
namespace {

at::Tensor contiguous_like(const at::Tensor& t, c10::IntArrayRef sizes) {
  return at::empty(sizes, t.options().memory_format(at::MemoryFormat::Contiguous));
}

// masked_fill_'s CPU kernel before it reads any data: a boolean mask, a warning for an expanded
// self, and the TensorIterator it builds (the mask broadcast to self).
void check_masked_fill(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool,
              "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  if (at::has_internal_overlap(self) == at::MemOverlap::Yes) {
    TORCH_WARN(
        "Use of masked_fill_ on expanded tensors is deprecated. Please clone() the tensor before "
        "performing this operation. This also applies to advanced indexing e.g. tensor[mask] = "
        "scalar");
  }
  at::TensorIteratorConfig()
      .set_check_mem_overlap(false)
      .check_all_same_dtype(false)
      .resize_outputs(false)
      .add_output(self)
      .add_const_input(mask)
      .build();
}

}  // namespace

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd): the CPU
// kernel's output is contiguous in the input's dtype, its statistics M values of the parameters'
// dtype (float for a reduced-precision input with float parameters) viewed with the input's
// leading sizes and 1s.
void native_layer_norm_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 5;
  const at::Tensor input = torch::jit::peek(*stack, 0, n).toTensor();
  const c10::DimVector normalized_shape = torch::jit::peek(*stack, 1, n).toDimVector();
  const at::Tensor weight = optional_tensor(torch::jit::peek(*stack, 2, n));
  const at::Tensor bias = optional_tensor(torch::jit::peek(*stack, 3, n));
  const bool mixed = at::native::is_mixed_type(input, weight, bias);
  if (mixed) at::native::check_mixed_data_type(input, weight, bias);
  const auto [m, unused] =
      at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  at::Tensor out = contiguous_like(input, input.sizes());
  const size_t axis = input.dim() - normalized_shape.size();
  c10::DimVector stat_shape(input.sizes().begin(), input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  const at::TensorOptions stats =
      input.options().dtype(at::native::param_scalar_type(input, mixed));
  at::Tensor mean = at::empty({m}, stats).view(stat_shape);
  at::Tensor rstd = at::empty({m}, stats).view(stat_shape);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out), std::move(mean), std::move(rstd));
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias): contiguous, each like the tensor it is
// the gradient of; undefined where output_mask leaves it out.
void native_layer_norm_backward_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 8;
  const at::Tensor input = torch::jit::peek(*stack, 1, n).toTensor();
  const c10::DimVector normalized_shape = torch::jit::peek(*stack, 2, n).toDimVector();
  const at::Tensor weight = optional_tensor(torch::jit::peek(*stack, 5, n));
  const at::Tensor bias = optional_tensor(torch::jit::peek(*stack, 6, n));
  const c10::List<bool> mask = torch::jit::peek(*stack, 7, n).toBoolList();
  at::native::_check_layer_norm_inputs(input, normalized_shape, weight, bias);
  auto gradient = [&](size_t i, const at::Tensor& of) {
    if (!mask.get(i)) return at::Tensor();
    // The kernel's empty_like of an undefined parameter fails: so does its call, on the caller.
    TORCH_CHECK(of.defined(), "native_layer_norm_backward: a gradient of a missing parameter");
    return contiguous_like(of, of.sizes());
  };
  at::Tensor grad_input = gradient(0, input);
  at::Tensor grad_weight = gradient(1, weight);
  at::Tensor grad_bias = gradient(2, bias);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(grad_input), std::move(grad_weight), std::move(grad_bias));
}

// where.self(condition, self, other): the result of the promoted dtype, laid out by the
// TensorIterator the CPU kernel builds over the three (broadcast) inputs.
void where_self_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  at::Tensor condition = torch::jit::peek(*stack, 0, n).toTensor();
  at::Tensor self = torch::jit::peek(*stack, 1, n).toTensor();
  at::Tensor other = torch::jit::peek(*stack, 2, n).toTensor();
  const c10::ScalarType result_type = at::result_type(self, other);
  at::Tensor out = at::empty({0}, self.options().dtype(result_type));
  if (self.scalar_type() != result_type) self = self.to(result_type);
  if (other.scalar_type() != result_type) other = other.to(result_type);
  // A uint8 condition: the kernel warns and converts it.
  if (condition.scalar_type() == at::kByte) condition = condition.to(at::kBool);
  TORCH_CHECK(condition.scalar_type() == at::kBool,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ",
              condition.scalar_type());
  at::TensorIteratorConfig()
      .check_all_same_dtype(false)
      .add_output(out)
      .add_const_input(condition)
      .add_const_input(self)
      .add_const_input(other)
      .build();
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

// index_select(self, dim, index): contiguous, self's sizes with index's length at `dim`.
void index_select_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  const at::Tensor self = torch::jit::peek(*stack, 0, n).toTensor();
  const int64_t dim = at::maybe_wrap_dim(torch::jit::peek(*stack, 1, n).toInt(), self.dim());
  const at::Tensor index = torch::jit::peek(*stack, 2, n).toTensor();
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(self.dim() > 0 || index.numel() == 1,
              "index_select(): Index to scalar can have only 1 value, got ", index.numel(),
              " value(s)");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  c10::DimVector sizes(self.sizes());
  if (self.dim() > 0) sizes[dim] = index.numel();
  if (self.dim() > 1 && index.numel() > 0 && self.numel() == 0) {
    TORCH_CHECK(self.size(dim) > 0, "index_select(): self indexing axis dim should be positive");
  }
  at::Tensor out = contiguous_like(self, sizes);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
// contiguous [num_weights, embedding_dim] of the gradient's dtype.
void embedding_dense_backward_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 5;
  const at::Tensor grad = torch::jit::peek(*stack, 0, n).toTensor();
  const at::Tensor indices = torch::jit::peek(*stack, 1, n).toTensor();
  const int64_t num_weights = torch::jit::peek(*stack, 2, n).toInt();
  at::checkScalarTypes("embedding_backward", at::TensorArg(indices, "indices", 2),
                       {at::kLong, at::kInt});
  at::Tensor grad_weight = contiguous_like(grad, {num_weights, grad.size(-1)});
  // The kernel views the gradient as one row per index: its error where they disagree.
  (void)grad.contiguous().view({indices.numel(), grad.size(-1)});
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(grad_weight));
}

// masked_fill.Scalar(self, mask, value): the CPU's composite kernel fills a contiguous clone of
// self broadcast with the mask.
void masked_fill_scalar_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  const at::Tensor self = torch::jit::peek(*stack, 0, n).toTensor();
  const at::Tensor mask = torch::jit::peek(*stack, 1, n).toTensor();
  const auto [expanded_mask, expanded_self] = at::expand_outplace(mask, self);
  at::Tensor out = contiguous_like(*expanded_self, expanded_self->sizes());
  check_masked_fill(out, *expanded_mask);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

// nn.MultiheadAttention's masks (`zeros_like(mask).masked_fill_(mask, -inf)`) at every new
// length.
void masked_fill_scalar_inplace_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  at::Tensor self = torch::jit::peek(*stack, 0, n).toTensor();
  check_masked_fill(self, torch::jit::peek(*stack, 1, n).toTensor());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(self));
}

// In-place random operators with a number parameter whose C++ meta function PyTorch does not
// export (uniform_'s, normal_'s and random_'s it does): bernoulli_ of a float (dropout of a
// strided input draws its mask so at every new shape) and exponential_. self is the result.
// Their CPU kernels check the parameter's value and the dtype, both in a family's key (random
// operators keep their floats there), so the family's first call, which waits for its task,
// raised those at the call; and a self whose elements overlap (an expanded tensor) is refused
// here, so that the CPU kernel judges such a call on the caller.
void random_inplace_meta(torch::jit::Stack* stack) {
  at::Tensor self = stack->front().toTensor();
  TORCH_CHECK(at::has_internal_overlap(self) == at::MemOverlap::No,
              "self may overlap itself: the CPU kernel judges the call");
  stack->clear();
  torch::jit::push(*stack, std::move(self));
}

namespace {

// A convolution's parameters after its tensors: stride, padding, dilation, transposed,
// output_padding, groups (six consecutive arguments of convolution_overrideable's schema, from
// `first`; convolution_backward's too, whose meta function is for a later session: see the
// README).
struct ConvParams {
  c10::DimVector stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;

  ConvParams(const torch::jit::Stack& stack, size_t first, size_t n)
      : stride(torch::jit::peek(stack, first, n).toDimVector()),
        padding(torch::jit::peek(stack, first + 1, n).toDimVector()),
        dilation(torch::jit::peek(stack, first + 2, n).toDimVector()),
        output_padding(torch::jit::peek(stack, first + 4, n).toDimVector()),
        transposed(torch::jit::peek(stack, first + 3, n).toBool()),
        groups(torch::jit::peek(stack, first + 5, n).toInt()) {}
};

// The checks the CPU's convolution makes of its arguments' shapes: _convolution on meta tensors,
// which reaches the overrideable backend only once they passed.
void check_convolution_shapes(const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, const ConvParams& p) {
  try {
    at::_convolution(input, weight, bias, p.stride, p.padding, p.dilation, p.transposed,
                     p.output_padding, p.groups, /*benchmark=*/false, /*deterministic=*/false,
                     /*cudnn_enabled=*/true, /*allow_tf32=*/true);
  } catch (const c10::NotImplementedError& e) {
    // Any other error, or this one for another reason, goes to the CPU kernel on the caller.
    if (std::string_view(e.what_without_backtrace()).rfind("convolution_overrideable", 0) != 0) {
      throw;
    }
  }
}

// The sizes of a convolution's result, or an error where the meta function does not describe
// the call (the CPU kernel then judges it on the caller).
std::vector<int64_t> convolution_sizes(const at::Tensor& input, const at::Tensor& weight,
                                       const ConvParams& p) {
  const size_t dims = static_cast<size_t>(input.dim());
  TORCH_CHECK(weight.dim() == input.dim() && p.stride.size() == dims - 2 &&
                  p.padding.size() == dims - 2 && p.dilation.size() == dims - 2 &&
                  (!p.transposed || p.output_padding.size() == dims - 2),
              "convolution: argument lengths the meta function does not describe");
  std::vector<int64_t> sizes =
      p.transposed ? at::native::conv_input_size(input.sizes(), weight.sizes(), p.padding,
                                                 p.output_padding, p.stride, p.dilation, p.groups)
                   : at::native::conv_output_size(input.sizes(), weight.sizes(), p.padding,
                                                  p.stride, p.dilation);
  for (size_t d = 2; d < dims; ++d) {
    TORCH_CHECK(sizes[d] > 0, "convolution: an output size the CPU kernel judges");
  }
  return sizes;
}

}  // namespace

// convolution_overrideable (what ATen calls on accel), whose CPU kernel is convolution: a CNN at
// a new resolution, a detector's images of varying sizes. The CPU's convolution makes its
// checks of the arguments' shapes (channels, groups, bias, dimensions, a kernel larger than the
// padded input, stride, padding) in _convolution, before it picks a backend: on meta tensors it
// picks the overrideable one, which has no meta kernel, so reaching it means the checks passed.
// What a backend checks later reads values in a family's key (output_padding against stride)
// or the dtypes, which the family's first call, waited for, raised at the call. accel's results
// are contiguous (the yaml's contiguous_results); their sizes are the convolution's formula.
void convolution_overrideable_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 9;
  const at::Tensor input = torch::jit::peek(*stack, 0, n).toTensor();
  const at::Tensor weight = torch::jit::peek(*stack, 1, n).toTensor();
  const std::optional<at::Tensor> bias = optional_tensor(torch::jit::peek(*stack, 2, n));
  const ConvParams params(*stack, 3, n);
  check_convolution_shapes(input, weight, bias, params);
  const std::vector<int64_t> sizes = convolution_sizes(input, weight, params);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, at::empty(sizes, input.options()));
}

// Batch norm (native_batch_norm and its backward), the CPU kernels' layouts: a CNN at a new
// resolution. Their shape checks are the composite batch_norm's, made on the caller before; the
// kernels check the dtypes (a family's key holds them) and that half-precision inputs come with
// float parameters or none of another dtype (check_mixed_data_type, made here).
namespace {

// Contiguous in some memory format, and which (the CPU kernels' rule).
bool dense_in_a_format(const at::Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
         t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}
at::MemoryFormat format_of_dense(const at::Tensor& t) {
  if (t.is_contiguous()) return at::MemoryFormat::Contiguous;
  return t.is_contiguous(at::MemoryFormat::ChannelsLast3d) ? at::MemoryFormat::ChannelsLast3d
                                                           : at::MemoryFormat::ChannelsLast;
}
bool contiguous_or_none(const at::Tensor& t) {
  return !t.defined() || t.is_contiguous();
}

}  // namespace

void native_batch_norm_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 8;
  auto tensor = [&](size_t i) { return optional_tensor(torch::jit::peek(*stack, i, n)); };
  const at::Tensor input = tensor(0);
  const at::Tensor weight = tensor(1), bias = tensor(2);
  const at::Tensor running_mean = tensor(3), running_var = tensor(4);
  const bool train = torch::jit::peek(*stack, 5, n).toBool();
  const int64_t channels = input.size(1);
  const bool mixed = at::native::is_mixed_type(input, weight, bias, running_mean, running_var);
  if (mixed) at::native::check_mixed_data_type(input, weight, bias, running_mean, running_var);
  const bool all_contiguous = dense_in_a_format(input) && contiguous_or_none(weight) &&
                              contiguous_or_none(bias) && contiguous_or_none(running_mean) &&
                              contiguous_or_none(running_var);
  at::Tensor out = at::empty_like(
      input, all_contiguous ? format_of_dense(input) : input.suggest_memory_format());
  const auto stats = input.options().dtype(mixed ? at::kFloat : input.scalar_type());
  at::Tensor save_mean = at::empty({train ? channels : 0}, stats);
  at::Tensor save_invstd = at::empty({train ? channels : 0}, stats);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out), std::move(save_mean), std::move(save_invstd));
}

void native_batch_norm_backward_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 10;
  auto tensor = [&](size_t i) { return optional_tensor(torch::jit::peek(*stack, i, n)); };
  const at::Tensor grad_out = tensor(0), input = tensor(1), weight = tensor(2);
  const at::Tensor running_mean = tensor(3), running_var = tensor(4);
  const at::Tensor save_mean = tensor(5), save_invstd = tensor(6);
  const auto mask = torch::jit::peek(*stack, 9, n).to<std::array<bool, 3>>();
  const int64_t channels = input.size(1);
  const bool mixed =
      at::native::is_mixed_type(input, weight, running_mean, running_var, save_mean, save_invstd);
  if (mixed) {
    at::native::check_mixed_data_type(input, weight, running_mean, running_var, save_mean,
                                      save_invstd);
  }
  const bool all_contiguous = dense_in_a_format(input) && dense_in_a_format(grad_out) &&
                              input.suggest_memory_format() == grad_out.suggest_memory_format();
  const auto params = input.options().dtype(mixed ? at::kFloat : input.scalar_type());
  at::Tensor grad_input, grad_weight, grad_bias;
  if (mask[0]) {
    grad_input = at::empty_like(
        input, all_contiguous ? format_of_dense(input) : input.suggest_memory_format());
  }
  if (mask[1]) grad_weight = at::empty({channels}, params);
  if (mask[2]) grad_bias = at::empty({channels}, params);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(grad_input), std::move(grad_weight), std::move(grad_bias));
}

// The CPU kernels of these are composite: their own code on meta tensors.
void native_dropout_backward_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  at::Tensor out = at::native::native_dropout_backward(torch::jit::peek(*stack, 0, n).toTensor(),
                                                       torch::jit::peek(*stack, 1, n).toTensor(),
                                                       torch::jit::peek(*stack, 2, n).toDouble());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

void constant_pad_nd_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  at::Tensor out = at::native::constant_pad_nd(torch::jit::peek(*stack, 0, n).toTensor(),
                                               torch::jit::peek(*stack, 1, n).toDimVector(),
                                               torch::jit::peek(*stack, 2, n).toScalar());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

// relu: clamp_min(self, 0) after a check of the dtype (not structured itself).
void relu_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 1;
  at::Tensor out = at::native::relu(torch::jit::peek(*stack, 0, n).toTensor());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

void relu_inplace_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 1;
  at::Tensor self = torch::jit::peek(*stack, 0, n).toTensor();
  at::native::relu_(self);
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(self));
}

void safe_softmax_meta(torch::jit::Stack* stack) {
  constexpr size_t n = 3;
  at::Tensor out = at::native::_safe_softmax(
      torch::jit::peek(*stack, 0, n).toTensor(), torch::jit::peek(*stack, 1, n).toInt(),
      torch::jit::peek(*stack, 2, n).toOptional<c10::ScalarType>());
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(out));
}

int64_t arange_length(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                      c10::ScalarType dtype) {
  int64_t length = 0;
  // The CPU kernel's dispatch (its name is in the error for other dtypes).
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "arange_cpu", [&] {
    if constexpr (std::is_same_v<scalar_t, int64_t>) {  // its length in integers
      at::native::arange_check_bounds(start, end, step);
      TORCH_CHECK(step.to<int64_t>() != 0, "step must be nonzero: ", step.to<double>(), " is 0 as ",
                  dtype, " (an int64 arange steps by the step converted to int64)");
    }
    length = at::native::compute_arange_size<scalar_t>(start, end, step);
  });
  return length;
}

int64_t arange_call_length(const torch::jit::Stack& stack, size_t begin, bool out) {
  const c10::Scalar start = stack[begin].toScalar();
  const c10::Scalar end = stack[begin + 1].toScalar();
  const c10::Scalar step = stack[begin + 2].toScalar();
  c10::ScalarType dtype;
  if (out) {
    dtype = stack[begin + 3].toTensor().scalar_type();
  } else if (!stack[begin + 3].isNone()) {
    dtype = stack[begin + 3].toScalarType();
  } else {  // arange's own rule: integers give int64, else the default dtype
    const bool integers = start.isIntegral(/*includeBool=*/true) &&
                          end.isIntegral(/*includeBool=*/true) &&
                          step.isIntegral(/*includeBool=*/true);
    dtype = integers ? at::kLong : c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  return arange_length(start, end, step, dtype);
}

}  // namespace accel::aten
