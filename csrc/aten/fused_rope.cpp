// accel::rms_norm_rope and accel::qkv_rms_norm_rope (and their backward operators): the
// per-head RMSNorm fused with the rotary embedding, on the torch-free kernels of
// csrc/kernels/host/norm_rope.h. Here: argument checks, result allocation, and the launch, as a
// task on the current accel stream (or at once for CPU tensors: the operators also serve the CPU).
// The kernels compute in float; weight, cos and sin are converted to float first (a copy of
// d or seq*d values), so mixed dtypes (bfloat16 activations, float32 weights under autocast) work
// without casting the activations.
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <array>
#include <tuple>
#include <vector>

#include "AccelNativeFunctions.h"
#include "aten/fused_cuda.h"
#include "aten/fused_util.h"
#include "kernels/host/norm_rope.h"

namespace accel::aten {
namespace {

namespace k = kernels::host;

void check_device(const char* op, const at::Tensor& first, const at::Tensor& t, const char* what) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device() == first.device(), op, ": ", what, " is on ", t.device(),
              ", expected it on ", first.device(), " like the other inputs");
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", what,
              " must be a floating-point tensor, got ", t.scalar_type());
  TORCH_CHECK(!t.is_complex() && t.layout() == at::kStrided, op, ": ", what,
              " must be a dense real tensor");
}

// `t` with its last dim contiguous (a copy where it is not).
at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

// The rows (n, s, h) of a tensor of sizes (n, s, h, d), or (n, h, s, d) when `heads_first`.
k::Rows rows_of(const at::Tensor& t, bool heads_first = false) {
  if (!t.defined()) return {};
  return {const_cast<void*>(t.const_data_ptr()), t.stride(0), t.stride(heads_first ? 2 : 1),
          t.stride(heads_first ? 1 : 2)};
}

struct Prepared {
  k::NormRope p;
  // The float weight, cos and sin the kernel reads (alive until the launch).
  std::vector<at::Tensor> keep;
};

// Checks `weight` (d values) and makes it the float weight `out`'s kernel reads.
void set_weight(const char* op, Prepared& out, const at::Tensor& weight, const char* name) {
  const int64_t d = out.p.d;
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d, op, ": ", name, " must have shape (", d,
              ",) (the head dim), got ", weight.sizes());
  out.keep[0] = weight.to(at::kFloat).contiguous();
  out.p.weight = out.keep[0].const_data_ptr<float>();
}

// Checks weight, cos and sin against rows of shape lead + (seq, heads, d) and fills `p`.
// cos and sin: (seq, d), or with leading dims that broadcast to `lead`.
void prepare(const char* op, Prepared& out, c10::IntArrayRef lead, int64_t seq, int64_t d,
             const at::Tensor& weight, const char* weight_name, const at::Tensor& cos,
             const at::Tensor& sin, double eps) {
  k::NormRope& p = out.p;
  TORCH_CHECK(d % 2 == 0, op, ": the head dim must be even for the rotary embedding, got ", d);
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos and sin must have one shape, got ",
              cos.sizes(), " and ", sin.sizes());
  std::vector<int64_t> want(lead.begin(), lead.end());
  want.push_back(seq);
  want.push_back(d);
  TORCH_CHECK(cos.dim() >= 2 && cos.size(-2) == seq && cos.size(-1) == d &&
                  cos.dim() <= static_cast<int64_t>(want.size()) &&
                  at::is_expandable_to(cos.sizes(), want),
              op, ": cos and sin must have shape (seq, head_dim) = (", seq, ", ", d,
              "), or leading dims that broadcast to the input's ", lead, ", got ", cos.sizes());
  p.n = c10::multiply_integers(lead);
  p.s = seq;
  p.d = d;
  p.eps = static_cast<float>(eps);
  auto trig = [&](const at::Tensor& t) {
    return last_dim_contiguous(t.to(at::kFloat).expand(want).reshape({p.n, seq, d}));
  };
  at::Tensor c = trig(cos), s = trig(sin);
  if (s.strides() != c.strides()) {  // the kernel takes one set of strides for both
    c = c.contiguous();
    s = s.contiguous();
  }
  out.keep = {at::Tensor(), c, s};
  set_weight(op, out, weight, weight_name);
  p.cos = out.keep[1].const_data_ptr<float>();
  p.sin = out.keep[2].const_data_ptr<float>();
  p.cos_stride_n = out.keep[1].stride(0);
  p.cos_stride_s = out.keep[1].stride(1);
}

// x (..., seq, heads, d) as (n, seq, heads, d) with a contiguous last dim.
at::Tensor as_rows(const char* op, const char* what, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 3, op, ": ", what, " must be (..., seq, heads, head_dim), got ",
              x.sizes());
  const int64_t n = c10::multiply_integers(x.sizes().slice(0, x.dim() - 3));
  return last_dim_contiguous(x.reshape({n, x.size(-3), x.size(-2), x.size(-1)}));
}

// The kernel parameters of rms_norm_rope (and its backward) for x (..., seq, heads, d).
Prepared prepare_rows(const char* op, const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& cos, const at::Tensor& sin, double eps, bool interleaved) {
  Prepared prep;
  prep.p.dtype = kernel_dtype(op, "x", x);
  prep.p.h = x.size(-2);
  prep.p.interleaved = interleaved;
  prepare(op, prep, x.sizes().slice(0, x.dim() - 3), x.size(-3), x.size(-1), weight, "weight", cos,
          sin, eps);
  return prep;
}

// The shared part of qkv_rms_norm_rope and its backward: checks, the (n, seq, total) view of
// qkv, and the kernel parameters of the q and k windows.
struct Qkv {
  int64_t n = 0, seq = 0, d = 0, total = 0;
  std::vector<int64_t> lead;
  at::Tensor x3;  // qkv as (n, seq, total), last dim contiguous
  Prepared q, k;

  Qkv(const char* op, const at::Tensor& qkv, const at::Tensor& q_weight, const at::Tensor& k_weight,
      const at::Tensor& cos, const at::Tensor& sin, int64_t num_q_heads, int64_t num_kv_heads,
      double eps) {
    for (auto [t, name] :
         {std::pair{&q_weight, "q_weight"}, {&k_weight, "k_weight"}, {&cos, "cos"}, {&sin, "sin"}})
      check_device(op, qkv, *t, name);
    TORCH_CHECK(num_q_heads > 0 && num_kv_heads > 0 && num_q_heads % num_kv_heads == 0, op,
                ": num_q_heads (", num_q_heads, ") must be a positive multiple of num_kv_heads (",
                num_kv_heads, ")");
    TORCH_CHECK(qkv.dim() >= 2, op,
                ": qkv must be (..., seq, (num_q_heads + 2*num_kv_heads) * head_dim), got ",
                qkv.sizes());
    const int64_t heads = num_q_heads + 2 * num_kv_heads;
    total = qkv.size(-1);
    TORCH_CHECK(total % heads == 0 && total > 0, op, ": the last dim of qkv (", total,
                ") is not num_q_heads + 2*num_kv_heads = ", heads, " times a head dim");
    d = total / heads;
    seq = qkv.size(-2);
    lead.assign(qkv.sizes().begin(), qkv.sizes().end() - 2);
    n = c10::multiply_integers(lead);
    x3 = last_dim_contiguous(qkv.reshape({n, seq, total}));
    q.p.dtype = k.p.dtype = kernel_dtype(op, "qkv", qkv);
    prepare(op, q, lead, seq, d, q_weight, "q_weight", cos, sin, eps);
    k = q;  // the same rows' positions: the same cos and sin tables
    set_weight(op, k, k_weight, "k_weight");
    q.p.h = num_q_heads;
    k.p.h = num_kv_heads;
  }

  // Sizes (..., h, seq, d): one of the results.
  std::vector<int64_t> heads_first(int64_t h) const {
    std::vector<int64_t> sizes = lead;
    sizes.insert(sizes.end(), {h, seq, d});
    return sizes;
  }

  // The rows of the heads after the first `heads_before` in t (n, seq, total).
  k::Rows window(const at::Tensor& t, int64_t heads_before) const {
    return {static_cast<char*>(const_cast<void*>(t.const_data_ptr())) +
                heads_before * d * static_cast<int64_t>(t.element_size()),
            t.stride(0), t.stride(1), d};
  }
};

}  // namespace

at::Tensor rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                         const at::Tensor& sin, double eps, bool interleaved) {
  constexpr const char* op = "accel::rms_norm_rope";
  for (auto [t, name] : {std::pair{&weight, "weight"}, {&cos, "cos"}, {&sin, "sin"}})
    check_device(op, x, *t, name);
  const at::Tensor x4 = as_rows(op, "x", x);
  const Prepared prep = prepare_rows(op, x, weight, cos, sin, eps, interleaved);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const at::Tensor out4 = out.view(x4.sizes());
  if (!x.is_cpu() && fused_on_cuda()) {
    // The checked float tables (n, seq, d) and weight, as the host kernel reads them.
    call_cuda_impl(x.device().index(), "accel::_rms_norm_rope_cuda",
                   {x4, prep.keep[0], prep.keep[1], prep.keep[2], eps, interleaved, out4});
    return out;
  }
  run_host_kernel(x, op,
                  [p = prep.p, in = rows_of(x4), o = rows_of(out4)](const k::ParallelFor& par) {
                    k::norm_rope_forward(p, in, o, par);
                  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rms_norm_rope_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
    const at::Tensor& sin, double eps, bool interleaved) {
  constexpr const char* op = "accel::rms_norm_rope_backward";
  for (auto [t, name] :
       {std::pair{&grad, "grad"}, {&weight, "weight"}, {&cos, "cos"}, {&sin, "sin"}})
    check_device(op, x, *t, name);
  TORCH_CHECK(grad.sizes() == x.sizes(), op, ": grad has shape ", grad.sizes(),
              ", expected the input's ", x.sizes());
  const at::Tensor x4 = as_rows(op, "x", x);
  const at::Tensor g4 = last_dim_contiguous(grad.to(x.scalar_type()).reshape(x4.sizes()));
  const Prepared prep = prepare_rows(op, x, weight, cos, sin, eps, interleaved);
  at::Tensor grad_x = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_w = at::empty({x.size(-1)}, x.options().dtype(at::kFloat));
  if (!x.is_cpu() && fused_on_cuda()) {
    call_cuda_impl(x.device().index(), "accel::_rms_norm_rope_backward_cuda",
                   {g4, x4, prep.keep[0], prep.keep[1], prep.keep[2], eps, interleaved,
                    grad_x.view(x4.sizes()), grad_w});
    return {grad_x, grad_w.to(weight.scalar_type())};
  }
  run_host_kernel(x, op,
                  [p = prep.p, in = rows_of(x4), g = rows_of(g4),
                   gx = rows_of(grad_x.view(x4.sizes())), gw = grad_w.mutable_data_ptr<float>()](
                      const k::ParallelFor& par) { k::norm_rope_backward(p, in, g, gx, gw, par); });
  return {grad_x, grad_w.to(weight.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rms_norm_rope(
    const at::Tensor& qkv, const at::Tensor& q_weight, const at::Tensor& k_weight,
    const at::Tensor& cos, const at::Tensor& sin, int64_t num_q_heads, int64_t num_kv_heads,
    double eps) {
  constexpr const char* op = "accel::qkv_rms_norm_rope";
  const Qkv a(op, qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps);
  const auto options = qkv.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor q = at::empty(a.heads_first(num_q_heads), options);
  at::Tensor k = at::empty(a.heads_first(num_kv_heads), options);
  at::Tensor v = at::empty(a.heads_first(num_kv_heads), options);
  if (!qkv.is_cpu() && fused_on_cuda()) {
    call_cuda_impl(
        qkv.device().index(), "accel::_qkv_rms_norm_rope_cuda",
        {a.x3, a.q.keep[0], a.k.keep[0], a.q.keep[1], a.q.keep[2], num_q_heads, num_kv_heads, eps,
         q.view({a.n, num_q_heads, a.seq, a.d}), k.view({a.n, num_kv_heads, a.seq, a.d}),
         v.view({a.n, num_kv_heads, a.seq, a.d})});
    return {q, k, v};
  }
  auto heads_rows = [&](const at::Tensor& t, int64_t h) {
    return rows_of(t.view({a.n, h, a.seq, a.d}), /*heads_first=*/true);
  };
  const k::QkvRows rows{a.q.p,
                        a.k.p,
                        a.window(a.x3, 0),
                        a.window(a.x3, num_q_heads),
                        a.window(a.x3, num_q_heads + num_kv_heads),
                        heads_rows(q, num_q_heads),
                        heads_rows(k, num_kv_heads),
                        heads_rows(v, num_kv_heads)};
  run_host_kernel(qkv, op,
                  [rows](const k::ParallelFor& par) { k::qkv_norm_rope_forward(rows, par); });
  return {q, k, v};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rms_norm_rope_backward(
    const std::optional<at::Tensor>& grad_q, const std::optional<at::Tensor>& grad_k,
    const std::optional<at::Tensor>& grad_v, const at::Tensor& qkv, const at::Tensor& q_weight,
    const at::Tensor& k_weight, const at::Tensor& cos, const at::Tensor& sin, int64_t num_q_heads,
    int64_t num_kv_heads, double eps) {
  constexpr const char* op = "accel::qkv_rms_norm_rope_backward";
  const Qkv a(op, qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps);
  // A gradient (..., h, seq, d) as (n, h, seq, d) rows; undefined: zeros (null rows).
  std::array<at::Tensor, 3> grads;  // q, k, v as (n, h, seq, d); undefined: none
  auto grad_rows = [&](const std::optional<at::Tensor>& g, int64_t h, const char* name,
                       at::Tensor& keep) {
    if (!g || !g->defined()) return k::Rows{};
    check_device(op, qkv, *g, name);
    const std::vector<int64_t> sizes = a.heads_first(h);
    TORCH_CHECK(g->sizes() == c10::IntArrayRef(sizes), op, ": ", name, " has shape ", g->sizes(),
                ", expected ", c10::IntArrayRef(sizes));
    keep = last_dim_contiguous(g->to(qkv.scalar_type()).reshape({a.n, h, a.seq, a.d}));
    return rows_of(keep, /*heads_first=*/true);
  };
  const k::Rows gq = grad_rows(grad_q, num_q_heads, "grad_q", grads[0]);
  const k::Rows gk = grad_rows(grad_k, num_kv_heads, "grad_k", grads[1]);
  const k::Rows gv = grad_rows(grad_v, num_kv_heads, "grad_v", grads[2]);
  at::Tensor grad_qkv =
      at::empty(qkv.sizes(), qkv.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_qw = at::empty({a.d}, qkv.options().dtype(at::kFloat));
  at::Tensor grad_kw = at::empty({a.d}, qkv.options().dtype(at::kFloat));
  const at::Tensor out3 = grad_qkv.view({a.n, a.seq, a.total});
  if (!qkv.is_cpu() && fused_on_cuda()) {
    auto grad = [](const at::Tensor& g) { return g.defined() ? c10::IValue(g) : c10::IValue(); };
    call_cuda_impl(
        qkv.device().index(), "accel::_qkv_rms_norm_rope_backward_cuda",
        {grad(grads[0]), grad(grads[1]), grad(grads[2]), a.x3, a.q.keep[0], a.k.keep[0],
         a.q.keep[1], a.q.keep[2], num_q_heads, num_kv_heads, eps, out3, grad_qw, grad_kw});
    return {grad_qkv, grad_qw.to(q_weight.scalar_type()), grad_kw.to(k_weight.scalar_type())};
  }
  run_host_kernel(
      qkv, op,
      [qp = a.q.p, kp = a.k.p, gq, gk, gv, q_in = a.window(a.x3, 0),
       k_in = a.window(a.x3, num_q_heads), q_out = a.window(out3, 0),
       k_out = a.window(out3, num_q_heads), v_out = a.window(out3, num_q_heads + num_kv_heads),
       gqw = grad_qw.mutable_data_ptr<float>(),
       gkw = grad_kw.mutable_data_ptr<float>()](const k::ParallelFor& par) {
        k::norm_rope_backward(qp, q_in, gq, q_out, gqw, par);
        k::norm_rope_backward(kp, k_in, gk, k_out, gkw, par);
        k::copy_rows(kp, gv, v_out, par);
      });
  return {grad_qkv, grad_qw.to(q_weight.scalar_type()), grad_kw.to(k_weight.scalar_type())};
}

}  // namespace accel::aten
