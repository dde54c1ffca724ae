// accel::linear_act (act(x @ weight^T + bias)), accel::linear_act_forward (the same, also
// returning the pre-activation the backward needs) and accel::linear_act_backward, with a choice
// of implementation (ACCEL_LINEAR_KERNEL, torch_accel.ops.linear_kernel):
//   aten   addmm (or mm) then the activation in place: ATen's operators, one after the other;
//   fused  one task on the stream: the matrix product through ATen's CPU kernel (MKL) on views
//          of the accel memory, then bias and activation (csrc/kernels/host/activation.h) applied
//          to panels of the result while they are in cache;
//   auto   fused where it measured faster (benchmarks/fused_ops.py), else aten (on the host
//          driver: aten, see auto_picks_fused).
// The backward is the activation's derivative (a torch-free kernel) then two products and a sum.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include <atomic>
#include <tuple>

#include "AccelNativeFunctions.h"
#include "aten/fused_linear.h"
#include "aten/fused_util.h"
#include "kernels/host/activation.h"

namespace accel::aten {
namespace {

namespace k = kernels::host;

std::atomic<LinearKernel> g_kernel{LinearKernel::Auto};

k::Activation parse_activation(const char* op, c10::string_view name) {
  if (name == "none") return k::Activation::None;
  if (name == "relu") return k::Activation::Relu;
  if (name == "gelu") return k::Activation::Gelu;
  if (name == "gelu_tanh") return k::Activation::GeluTanh;
  if (name == "silu") return k::Activation::Silu;
  TORCH_CHECK(false, op, ": unknown activation '", name,
              "'; use none, relu, gelu, gelu_tanh or silu");
}

// Whether the backward reads the pre-activation (else the output, or nothing).
bool needs_pre(k::Activation a) {
  return a == k::Activation::Gelu || a == k::Activation::GeluTanh || a == k::Activation::Silu;
}

struct Args {
  at::Tensor x2;  // x as (rows, in_features)
  int64_t rows = 0, in = 0, out = 0;
  std::vector<int64_t> out_sizes;
  k::Activation act = k::Activation::None;
};

Args check(const char* op, const at::Tensor& x, const at::Tensor& weight,
           const std::optional<at::Tensor>& bias, c10::string_view activation) {
  Args a;
  a.act = parse_activation(op, activation);
  (void)kernel_dtype(op, "x", x);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dim (..., in_features)");
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be (out_features, in_features), got ",
              weight.sizes());
  TORCH_CHECK(weight.size(1) == x.size(-1), op, ": x has ", x.size(-1), " features but weight is ",
              weight.sizes(), " (out_features, in_features)");
  auto same = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.device() == x.device(), op, ": ", name, " is on ", t.device(),
                ", expected it on ", x.device(), " like x");
    TORCH_CHECK(t.scalar_type() == x.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(),
                " but x has ", x.scalar_type(), " (use one dtype, or torch.autocast)");
  };
  same(weight, "weight");
  if (bias && bias->defined()) {
    same(*bias, "bias");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == weight.size(0), op, ": bias must be (",
                weight.size(0), ",), got ", bias->sizes());
  }
  a.in = x.size(-1);
  a.out = weight.size(0);
  a.rows = c10::multiply_integers(x.sizes().slice(0, x.dim() - 1));
  a.x2 = x.reshape({a.rows, a.in});
  a.out_sizes.assign(x.sizes().begin(), x.sizes().end() - 1);
  a.out_sizes.push_back(a.out);
  return a;
}

// auto: the implementation measured faster for the shape. On the host driver that is aten
// everywhere measured (benchmarks/fused_ops.py on a 2-core EPYC, gelu, bf16 and fp32, from
// 64x4096x4096 to 4096^3: fused 0.76x to 0.97x of addmm + gelu_): the product dominates, ATen's
// in-place activation pass is cheaper than the epilogue's (AVX2 here, ATen's AVX512), and MKL
// pays for every extra panel. So auto runs aten until a kernel measures faster.
bool auto_picks_fused(const Args&, const at::Tensor&) {
  return false;
}

// The activation of `t`: in place, or into a new tensor when `keep` (t is the pre-activation).
at::Tensor activate(k::Activation act, at::Tensor& t, bool keep) {
  switch (act) {
    case k::Activation::None: return t;
    case k::Activation::Relu: return keep ? at::relu(t) : at::relu_(t);
    case k::Activation::Gelu: return keep ? at::gelu(t) : at::gelu_(t);
    case k::Activation::GeluTanh: return keep ? at::gelu(t, "tanh") : at::gelu_(t, "tanh");
    case k::Activation::Silu: return keep ? at::silu(t) : at::silu_(t);
  }
  return t;
}

// aten: addmm (or mm), then the activation; pre (when asked for) is the product itself.
std::tuple<at::Tensor, at::Tensor> run_aten(const Args& a, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias, bool want_pre) {
  at::Tensor pre =
      bias && bias->defined() ? at::addmm(*bias, a.x2, weight.t()) : at::mm(a.x2, weight.t());
  at::Tensor out = activate(a.act, pre, want_pre);
  return {out, want_pre ? pre : at::Tensor()};
}

// Rows of the fused path's panels: each panel's product is followed at once by its epilogue,
// while the panel is in cache (about 2 MiB of output). Every panel's product reads all of the
// weight again, so where the weight is larger than that saves (over 8 MiB) one panel does all.
int64_t panel_rows(int64_t rows, int64_t cols, int64_t in, int64_t element_size) {
  if (cols * in * element_size > (int64_t{8} << 20)) return rows;
  return std::max<int64_t>(64, (int64_t{2} << 20) / std::max<int64_t>(1, cols * element_size));
}

std::tuple<at::Tensor, at::Tensor> run_fused(const char* op, const Args& a, const at::Tensor& x,
                                             const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias, bool want_pre) {
  const auto options = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty({a.rows, a.out}, options);
  at::Tensor pre = want_pre ? at::empty({a.rows, a.out}, options) : at::Tensor();
  at::Tensor b32 = bias && bias->defined() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const k::Dtype dtype = kernel_dtype(op, "x", x);
  const int64_t panel = panel_rows(a.rows, a.out, a.in, x.element_size());
  auto body = [x2 = Layout::of(a.x2, false), w = Layout::of(weight, false), o = Layout::of(out),
               p = pre.defined() ? Layout::of(pre) : Layout(),
               bias_ptr = b32.defined() ? b32.const_data_ptr<float>() : nullptr, dtype, act = a.act,
               rows = a.rows, cols = a.out, panel](const k::ParallelFor& parallel) {
    const at::Tensor ov = o.cpu_view(), xv = x2.cpu_view(), wt = w.cpu_view().t();
    const at::Tensor pv = p.dtype == c10::ScalarType::Undefined ? at::Tensor() : p.cpu_view();
    for (int64_t first = 0; first < rows; first += panel) {
      const int64_t n = std::min(panel, rows - first);
      at::Tensor op = ov.narrow(0, first, n);
      at::mm_out(op, xv.narrow(0, first, n), wt);
      const k::Block block{op.data_ptr(), cols};
      k::bias_act(dtype, act, n, cols, block, bias_ptr, block,
                  k::Block{pv.defined() ? pv.narrow(0, first, n).data_ptr() : nullptr, cols},
                  parallel);
    }
  };
  run_host_kernel(x, op, std::move(body));
  return {out, pre};
}

std::tuple<at::Tensor, at::Tensor> linear_act_impl(const char* op, const at::Tensor& x,
                                                   const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   c10::string_view activation, bool want_pre) {
  const Args a = check(op, x, weight, bias, activation);
  const bool pre_needed = want_pre && needs_pre(a.act);
  LinearKernel kind = linear_kernel();
  if (kind == LinearKernel::Auto)
    kind = auto_picks_fused(a, x) ? LinearKernel::Fused : LinearKernel::Aten;
  // The fused path runs on the host: CPU tensors, or accel memory the host can touch.
  if (kind == LinearKernel::Fused && !x.is_cpu() && !host_accessible()) kind = LinearKernel::Aten;
  auto [out, pre] = kind == LinearKernel::Fused ? run_fused(op, a, x, weight, bias, pre_needed)
                                                : run_aten(a, weight, bias, pre_needed);
  out = out.view(a.out_sizes);
  pre = pre.defined() ? pre.view(a.out_sizes) : at::empty({0}, x.options());
  return {out, pre};
}

}  // namespace

LinearKernel linear_kernel() {
  return g_kernel.load(std::memory_order_relaxed);
}
void set_linear_kernel(LinearKernel kernel) {
  g_kernel.store(kernel, std::memory_order_relaxed);
}

at::Tensor linear_act(const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, c10::string_view activation) {
  return std::get<0>(
      linear_act_impl("accel::linear_act", x, weight, bias, activation, /*want_pre=*/false));
}

std::tuple<at::Tensor, at::Tensor> linear_act_forward(const at::Tensor& x, const at::Tensor& weight,
                                                      const std::optional<at::Tensor>& bias,
                                                      c10::string_view activation) {
  return linear_act_impl("accel::linear_act_forward", x, weight, bias, activation,
                         /*want_pre=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_act_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& saved,
    c10::string_view activation, bool has_bias) {
  constexpr const char* op = "accel::linear_act_backward";
  const Args a = check(op, x, weight, std::nullopt, activation);
  TORCH_CHECK(grad.sizes() == c10::IntArrayRef(a.out_sizes), op, ": grad has shape ", grad.sizes(),
              ", expected ", c10::IntArrayRef(a.out_sizes));
  at::Tensor g2 = grad.to(x.scalar_type()).reshape({a.rows, a.out}).contiguous();
  at::Tensor gpre = g2;
  if (a.act != k::Activation::None) {
    TORCH_CHECK(saved.sizes() == c10::IntArrayRef(a.out_sizes), op, ": saved has shape ",
                saved.sizes(), ", expected the ",
                needs_pre(a.act) ? "pre-activation's " : "output's ",
                c10::IntArrayRef(a.out_sizes));
    const at::Tensor s2 = saved.to(x.scalar_type()).reshape({a.rows, a.out}).contiguous();
    gpre = at::empty({a.rows, a.out}, g2.options());
    auto body = [g = g2.const_data_ptr(), s = s2.const_data_ptr(), gp = gpre.mutable_data_ptr(),
                 dtype = kernel_dtype(op, "x", x), act = a.act, rows = a.rows,
                 cols = a.out](const k::ParallelFor& parallel) {
      k::act_backward(dtype, act, rows, cols, k::Block{const_cast<void*>(g), cols},
                      k::Block{const_cast<void*>(s), cols}, k::Block{gp, cols}, parallel);
    };
    run_host_kernel(x, op, std::move(body));
  }
  at::Tensor grad_x = at::mm(gpre, weight).view(x.sizes());
  at::Tensor grad_w = at::mm(gpre.t(), a.x2);
  at::Tensor grad_b = has_bias ? at::sum(gpre, 0) : at::Tensor();
  return {grad_x, grad_w, grad_b};
}

namespace {

// Autocast: a linear layer, so the product runs in autocast's lower precision, as F.linear.
template <bool Pre>
auto autocast_kernel(const at::Tensor& x, const at::Tensor& weight,
                     const std::optional<at::Tensor>& bias, c10::string_view activation) {
  const AutocastLowerPrecision lower;
  const at::Tensor xc = lower(x), wc = lower(weight);
  std::optional<at::Tensor> bc;
  if (bias && bias->defined()) bc = lower(*bias);
  if constexpr (Pre) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("accel::linear_act_forward", "")
                               .typed<decltype(linear_act_forward)>();
    return op.call(xc, wc, bc, activation);
  } else {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("accel::linear_act", "")
                               .typed<decltype(linear_act)>();
    return op.call(xc, wc, bc, activation);
  }
}

TORCH_LIBRARY_IMPL(accel, AutocastPrivateUse1, m) {
  m.impl("linear_act", TORCH_FN(autocast_kernel<false>));
  m.impl("linear_act_forward", TORCH_FN(autocast_kernel<true>));
}

}  // namespace
}  // namespace accel::aten
