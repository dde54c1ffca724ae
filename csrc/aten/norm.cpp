// Layer norm on the underlying tier, computing straight into its three results.
//
// native_layer_norm and its backward return several tensors and have no out= kernel, so the
// generic underlying task would run the CPU operator and copy every result into accel memory
// (a second pass over the data). These task functions (yaml `into:`) call ATen's CPU layer
// norm kernels with the accel results as outputs instead. Shapes and dtypes of the results come
// from the meta pass, as for every underlying operator; the checks ran there too.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/accumulate.h>

#include <optional>

#ifdef ACCEL_ATEN_CPU_STUBS
#include <ATen/native/layer_norm.h>
#else
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#endif

#include "AccelNativeFunctions.h"

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

at::Tensor contiguous_or_undefined(const c10::IValue& v) {
  if (v.isNone()) return at::Tensor();
  const at::Tensor& t = v.toTensor();
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
  const at::Tensor beta = args[6].isNone() ? at::Tensor() : args[6].toTensor();
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

}  // namespace accel::aten
