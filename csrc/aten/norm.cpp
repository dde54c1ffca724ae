// Layer norm on the underlying tier, computing straight into its three results; batch norm's
// statistics in eval mode as CUDA returns them.
//
// native_layer_norm and its backward return several tensors and have no out= kernel, so the
// generic underlying task would run the CPU operator and copy every result into accel memory
// (a second pass over the data). These task functions (yaml `into:`) call ATen's CPU layer
// norm kernels with the accel results as outputs instead. Shapes and dtypes of the results come
// from the meta pass, as for every underlying operator; the checks ran there too.
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_native_batch_norm_legit.h>
#include <ATen/ops/_native_batch_norm_legit_no_training.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <optional>

#ifdef ACCEL_ATEN_CPU_STUBS
#include <ATen/native/layer_norm.h>
#else
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#endif

#include "AccelNativeFunctions.h"
#include "aten/dispatch_util.h"
#include "aten/fallback.h"

namespace accel::aten {
namespace {

struct Rows {
  int64_t m;  // rows: the product of the leading (not normalized) dimensions
  int64_t n;  // elements per row: the product of the normalized dimensions
};

Rows rows_of(const at::Tensor& input, size_t normalized_ndim) {
  const auto sizes = input.sizes();
  const auto split = sizes.begin() + (sizes.size() - normalized_ndim);
  return {c10::multiply_integers(sizes.begin(), split), c10::multiply_integers(split, sizes.end())};
}

// Whether the statistics stack[first] and stack[first + 1] (None or tensors) are of another
// dtype than `want` (the one the CPU's backward kernel reads).
bool statistics_not_in(const torch::jit::Stack& stack, size_t first, c10::ScalarType want) {
  return std::any_of(stack.begin() + first, stack.begin() + first + 2, [&](const c10::IValue& v) {
    const at::Tensor& t = optional_tensor(v);
    return t.defined() && t.scalar_type() != want;
  });
}

at::Tensor contiguous_or_undefined(const c10::IValue& v) {
  const at::Tensor t = optional_tensor(v);
  return t.defined() ? t.contiguous() : t;
}

// The dtype of the parameters: the weight's or else the bias's (ATen's CPU kernels take float
// ones for a reduced-precision input), the input's without either.
c10::ScalarType param_dtype(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta) {
  return gamma.defined()  ? gamma.scalar_type()
         : beta.defined() ? beta.scalar_type()
                          : x.scalar_type();
}

// The dtype of mean and rstd in ATen's CPU kernels: float for reduced-precision inputs with
// float parameters (a weight, a bias or both), the input's dtype otherwise.
c10::ScalarType stats_dtype(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta) {
  const bool mixed =
      at::isReducedFloatingType(x.scalar_type()) && param_dtype(x, gamma, beta) == at::kFloat;
  return mixed ? at::kFloat : x.scalar_type();
}

// A contiguous tensor of `dtype` to compute into: `result` itself, or a temporary copied back
// by `finish`.
struct Output {
  at::Tensor target;
  at::Tensor work;

  explicit Output(const at::Tensor& result, std::optional<c10::ScalarType> dtype = std::nullopt)
      : target(result) {
    const c10::ScalarType want =
        dtype.value_or(result.defined() ? result.scalar_type() : c10::ScalarType::Undefined);
    const bool direct =
        !result.defined() || (result.is_contiguous() && result.scalar_type() == want);
    work = direct ? result : at::empty(result.sizes(), result.options().dtype(want));
  }
  void finish() {
    if (work.defined() && !work.is_same(target)) target.copy_(work);
  }
};

// The statistic batch norm normalizes with in eval mode, as PyTorch's decomposition computes it
// (torch._decomp's native_batch_norm_helper): 1/sqrt(running_var + eps), of `dtype`.
at::Tensor eval_invstd(const at::Tensor& running_var, c10::ScalarType dtype, double eps) {
  at::Tensor invstd = running_var.to(dtype).add(eps);
  return invstd.sqrt_().reciprocal_();
}

}  // namespace

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
void native_layer_norm_into(torch::jit::Stack& args, const std::vector<at::Tensor>& results) {
  const at::Tensor x = args[0].toTensor().contiguous();
  const size_t normalized_ndim = args[1].toDimVector().size();
  const at::Tensor gamma = contiguous_or_undefined(args[2]);
  const at::Tensor beta = contiguous_or_undefined(args[3]);
  const double eps = args[4].toDouble();
  [[maybe_unused]] const Rows r = rows_of(x, normalized_ndim);  // unused without stubs

  Output y(results[0]);
  // mean and rstd have the leading dimensions of the input and 1s after; the kernel writes
  // them as M values of stats_dtype() (the results have that dtype too: the first call of a
  // signature runs the CPU operator and later calls allocate what it returned).
  const c10::ScalarType stats = stats_dtype(x, gamma, beta);
  Output mean(results[1], stats);
  Output rstd(results[2], stats);
#ifdef ACCEL_ATEN_CPU_STUBS
  at::Tensor mean_rows = mean.work.view({r.m});
  at::Tensor rstd_rows = rstd.work.view({r.m});
  // ATen's CPU kernel vectorizes the normalization only when both weight and bias are given
  // (a scalar loop otherwise, about twice as slow): ones and zeros leave the values as they are.
  // They take the dtype of the parameter given: the kernel wants both float or both the input's.
  const at::TensorOptions params = x.options().dtype(param_dtype(x, gamma, beta));
  const at::Tensor weight = gamma.defined() ? gamma : at::ones({r.n}, params);
  const at::Tensor bias = beta.defined() ? beta : at::zeros({r.n}, params);
  at::native::LayerNormKernel(c10::kCPU, x, weight, bias, r.m, r.n, eps, &y.work, &mean_rows,
                              &rstd_rows);
#else
  const auto [out, m, s] =
      at::native_layer_norm(x, x.sizes().slice(x.dim() - normalized_ndim), gamma, beta, eps);
  y.work.copy_(out);
  mean.work.copy_(m);
  rstd.work.copy_(s);
#endif
  y.finish();
  mean.finish();
  rstd.finish();
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias); masked-out gradients are undefined.
void native_layer_norm_backward_into(torch::jit::Stack& args,
                                     const std::vector<at::Tensor>& results) {
  const at::Tensor dy = args[0].toTensor().contiguous();
  const at::Tensor x = args[1].toTensor().contiguous();
  const size_t normalized_ndim = args[2].toDimVector().size();
  const at::Tensor gamma = contiguous_or_undefined(args[5]);
  // Only its dtype is read here (and ATen's kernel takes it as it is).
  const at::Tensor beta = optional_tensor(args[6]);
  // The statistics in the dtype the kernel reads (see native_layer_norm_into).
  const c10::ScalarType stats = stats_dtype(x, gamma, beta);
  const at::Tensor mean = args[3].toTensor().to(stats).contiguous();
  const at::Tensor rstd = args[4].toTensor().to(stats).contiguous();
  const Rows r = rows_of(x, normalized_ndim);

  Output dx(results[0]);
  Output dgamma(results[1]);
  Output dbeta(results[2]);
  if (r.m > 0) {
#ifdef ACCEL_ATEN_CPU_STUBS
    at::native::LayerNormBackwardKernel(c10::kCPU, dy, x, mean, rstd, gamma, r.m, r.n, &dx.work,
                                        &dgamma.work, &dbeta.work);
#else
    const std::array<bool, 3> mask = {dx.work.defined(), dgamma.work.defined(),
                                      dbeta.work.defined()};
    const auto [gx, gg, gb] = at::native_layer_norm_backward(
        dy, x, x.sizes().slice(x.dim() - normalized_ndim), mean, rstd, gamma, beta, mask);
    for (auto [from, to] : {std::pair{gx, dx.work}, {gg, dgamma.work}, {gb, dbeta.work}}) {
      if (to.defined()) to.copy_(from);
    }
#endif
  } else {
    // No rows: the parameter gradients are sums over nothing.
    if (dgamma.work.defined()) dgamma.work.zero_();
    if (dbeta.work.defined()) dbeta.work.zero_();
  }
  dx.finish();
  dgamma.finish();
  dbeta.finish();
}

// native_layer_norm of a half-precision input returns mean and rstd in float on CUDA, and
// PyTorch's meta function says so for every device; the CPU kernel returns them in the input's
// dtype unless a parameter is float. torch.compile keeps native_layer_norm whole on accel while
// it decomposes the backward, whose generated kernels read the statistics as the meta function
// typed them: half statistics there gave wrong gradients. The call runs as usual (the first
// call of a signature gives the CPU kernel's dtypes), then its statistics are converted
// (values rounded as the CPU kernel rounded them). The out= form writes the functional form's
// results.
bool layer_norm_float_statistics_when(const c10::OperatorHandle& op,
                                      const torch::jit::Stack& stack) {
  if (is_out_form(op.schema())) return true;
  const size_t begin = stack.size() - op.schema().arguments().size();
  return at::isReducedFloatingType(stack[begin].toTensor().scalar_type());
}

bool layer_norm_float_statistics(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  thread_local bool inside = false;  // the call below comes back here
  if (inside) return false;
  if (out_through_functional(op, stack)) return true;
  // Else statistics of the input's dtype.
  if (!layer_norm_float_statistics_when(op, *stack)) return false;
  const size_t begin = stack->size() - op.schema().arguments().size();
  const c10::ScalarType input = (*stack)[begin].toTensor().scalar_type();
  call_again(op, stack, inside);
  convert_tensors(stack, {begin + 1, begin + 2}, at::toOpMathType(input));  // mean, rstd
  return true;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask): the CPU kernel takes the statistics only in the dtype it returns them in (see
// stats_dtype), accel's forward returns float: they are converted back, and the call runs with
// them.
namespace {

c10::ScalarType backward_stats_dtype(const torch::jit::Stack& stack, size_t begin) {
  auto tensor = [&](size_t i) -> const at::Tensor& { return optional_tensor(stack[begin + i]); };
  return stats_dtype(tensor(1), tensor(5), tensor(6));
}

}  // namespace

bool layer_norm_backward_statistics_when(const c10::OperatorHandle& op,
                                         const torch::jit::Stack& stack) {
  const size_t begin = stack.size() - op.schema().arguments().size();
  return statistics_not_in(stack, begin + 3, backward_stats_dtype(stack, begin));  // mean, rstd
}

bool layer_norm_backward_statistics(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t begin = stack->size() - op.schema().arguments().size();
  convert_tensors(stack, {begin + 3, begin + 4}, backward_stats_dtype(*stack, begin));
  return false;  // the call runs as usual, with these statistics
}

// Batch norm's statistics as CUDA returns them: native_batch_norm, _native_batch_norm_legit
// (_functional, .no_stats), _batch_norm_with_update, _native_batch_norm_legit_no_training and
// _batch_norm_no_update -> (out, save_mean, save_invstd, ...). So do PyTorch's meta functions,
// hence fake tensors and torch.compile:
// - in eval mode CUDA's kernels return the statistics they normalized with: running_mean and
//   1/sqrt(running_var + eps), C values of the input's computation dtype; the CPU kernel
//   returns empty ones;
// - in training mode the batch's statistics are float for a half-precision input; the CPU
//   kernel rounds them to the input's dtype unless the parameters are float.
// The call runs as usual (the first call of a signature gives the CPU kernel's shapes and
// dtypes), then its statistics are replaced or converted. Their out= forms run the functional
// form and write its results into the out= tensors.
namespace {

// Whether the batch norm call on stack[begin:] normalizes with the batch's statistics; nullopt
// for .no_stats in eval mode (the kernel's error: eval mode needs running statistics).
std::optional<bool> batch_norm_training(const c10::FunctionSchema& schema,
                                        const torch::jit::Stack& stack, size_t begin) {
  const std::string& name = schema.name();
  if (name == "aten::_batch_norm_with_update") return true;
  if (schema.overload_name() == "no_stats") {  // no running statistics at all
    return stack[begin + 3].toBool() ? std::optional<bool>(true) : std::nullopt;
  }
  if (name == "aten::_native_batch_norm_legit_no_training" ||
      name == "aten::_batch_norm_no_update") {
    return false;
  }
  return stack[begin + 5].toBool();
}

}  // namespace

// In training, the statistics of a half-precision input; in eval mode, always.
bool batch_norm_statistics_when(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (is_out_form(schema)) return true;
  const size_t begin = stack.size() - schema.arguments().size();
  const std::optional<bool> training = batch_norm_training(schema, stack, begin);
  if (!training) return false;
  const c10::ScalarType input = stack[begin].toTensor().scalar_type();
  return !*training || at::toOpMathType(input) != input;
}

bool batch_norm_statistics(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  thread_local bool inside = false;  // the call below comes back here
  if (inside) return false;
  if (out_through_functional(op, stack)) return true;
  // Else the call runs as usual where the CPU's dtypes are CUDA's (training, no half precision).
  if (!batch_norm_statistics_when(op, *stack)) return false;
  const c10::FunctionSchema& schema = op.schema();
  const std::string& name = schema.name();
  const size_t n = schema.arguments().size();
  const size_t begin = stack->size() - n;
  auto arg = [&](size_t i) -> const c10::IValue& { return (*stack)[begin + i]; };
  const at::Tensor input = arg(0).toTensor();
  const bool no_training = name == "aten::_native_batch_norm_legit_no_training";
  const bool training = *batch_norm_training(schema, *stack, begin);
  const c10::ScalarType dtype = at::toOpMathType(input.scalar_type());
  if (training) {
    call_again(op, stack, inside);
    convert_tensors(stack, {begin + 1, begin + 2}, dtype);  // save_mean, save_invstd
    return true;
  }
  if (arg(3).isNone() || arg(4).isNone()) {
    check_cpu_kernel_inputs(op, *stack);
    return false;  // the kernel's error
  }
  if (name == "aten::_batch_norm_no_update") {
    // Its kernel (CompositeExplicitAutograd) calls the CPU's batch norm whatever the device,
    // cuda's too. As PyTorch's decomposition: _native_batch_norm_legit_no_training's results
    // (on accel, these statistics) and an empty reserve.
    static const c10::OperatorHandle no_update = c10::Dispatcher::singleton().findSchemaOrThrow(
        "aten::_native_batch_norm_legit_no_training", "");
    no_update.callBoxed(stack);
    stack->emplace_back(at::empty({0}, input.options().dtype(at::kByte)));
    return true;
  }
  const at::Tensor running_mean = arg(3).toTensor();
  const at::Tensor running_var = arg(4).toTensor();
  const double eps = arg(no_training ? 6 : 7).toDouble();
  call_again(op, stack, inside);
  // The results replaced the arguments: save_mean and save_invstd follow the output.
  (*stack)[begin + 1] = running_mean.to(dtype, /*non_blocking=*/false, /*copy=*/true);
  (*stack)[begin + 2] = eval_invstd(running_var, dtype, eps);
  return true;
}

// native_batch_norm_backward and batch_norm_backward (grad_out, input, weight?, running_mean?,
// running_var?, save_mean?, save_invstd?, ...): the CPU kernel takes the saved statistics only
// in the dtype it returns them in: the parameters' (float for a half input with float
// parameters), else the input's. Accel's float statistics of a half-precision input in eval
// mode (above) are converted to it, and the call runs with them.
namespace {

// The dtype the CPU's backward kernel reads save_mean and save_invstd in.
c10::ScalarType batch_norm_backward_stats_dtype(const torch::jit::Stack& stack, size_t begin) {
  auto tensor = [&](size_t i) -> const at::Tensor& { return optional_tensor(stack[begin + i]); };
  const at::Tensor& input = tensor(1);
  const at::Tensor& param = tensor(2).defined() ? tensor(2) : tensor(3);
  return at::isReducedFloatingType(input.scalar_type()) && param.defined() ? param.scalar_type()
                                                                           : input.scalar_type();
}

}  // namespace

bool batch_norm_backward_statistics_when(const c10::OperatorHandle& op,
                                         const torch::jit::Stack& stack) {
  const size_t begin = stack.size() - op.schema().arguments().size();
  // save_mean, save_invstd
  return statistics_not_in(stack, begin + 5, batch_norm_backward_stats_dtype(stack, begin));
}

bool batch_norm_backward_statistics(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t begin = stack->size() - op.schema().arguments().size();
  convert_tensors(stack, {begin + 5, begin + 6}, batch_norm_backward_stats_dtype(*stack, begin));
  return false;  // the call runs as usual, with these statistics
}

// The task of the functional batch norm operators above, training or not: the CPU kernel's
// results, except that statistics allocated from the meta functions (C of them, in a graph
// capture that was the first call of its signature) where the CPU kernel returns none get the
// values batch_norm_statistics gives (it replaces them anyway; the task must not fail).
void batch_norm_into(torch::jit::Stack& args, const std::vector<at::Tensor>& results) {
  auto tensor = [&](size_t i) { return optional_tensor(args[i]); };
  const at::Tensor input = tensor(0);
  const at::Tensor running_mean = tensor(3);
  const at::Tensor running_var = tensor(4);
  std::vector<at::Tensor> cpu;
  if (args.size() == 7) {  // _native_batch_norm_legit_no_training
    const auto [y, m, s] = at::_native_batch_norm_legit_no_training(
        input, tensor(1), tensor(2), running_mean, running_var, args[5].toDouble(),
        args[6].toDouble());
    cpu = {y, m, s};
  } else if (results.size() == 5) {  // _native_batch_norm_legit_functional
    const auto [y, m, s, rm, rv] = at::_native_batch_norm_legit_functional(
        input, tensor(1), tensor(2), running_mean, running_var, args[5].toBool(),
        args[6].toDouble(), args[7].toDouble());
    cpu = {y, m, s, rm, rv};
  } else {  // native_batch_norm, _native_batch_norm_legit: the same CPU kernel
    const auto [y, m, s] =
        at::native_batch_norm(input, tensor(1), tensor(2), running_mean, running_var,
                              args[5].toBool(), args[6].toDouble(), args[7].toDouble());
    cpu = {y, m, s};
  }
  const double eps = args[args.size() - 1].toDouble();
  for (size_t i = 0; i < results.size(); ++i) {
    const at::Tensor& to = results[i];
    if (!to.defined()) continue;
    if (to.sizes() == cpu[i].sizes()) {
      to.copy_(cpu[i]);
    } else if (i == 1) {
      to.copy_(running_mean);
    } else if (i == 2) {
      to.copy_(eval_invstd(running_var, to.scalar_type(), eps));
    }
  }
}

void check_cpu_kernel_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.name() == "aten::_batch_norm_no_update") {
    // Its CPU kernel reads the running statistics whether they were given or not.
    const size_t begin = stack.size() - schema.arguments().size();
    TORCH_CHECK(!stack[begin + 3].isNone() && !stack[begin + 4].isNone(), schema.name(),
                ": running_mean and running_var must be given (eval mode normalizes with them)");
  }
}

}  // namespace accel::aten
