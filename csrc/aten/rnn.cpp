// The fused LSTM and GRU cells. ATen's nn.LSTM/GRU/LSTMCell/GRUCell take CUDA's path for
// PrivateUse1 and call these operators, which have CUDA kernels only. Here each cell is one task
// on the current stream: the pointwise part of the cell on CPU views of the accel memory, in
// float for half and bfloat16 (as CUDA's kernels accumulate), with the same workspace layout as
// CUDA's kernels, so the backward operators read what the forward wrote:
//   LSTM workspace [B, 4H]: the gates after activation, i f g o;
//   GRU workspace  [B, 5H]: r, z, n, hx, and the hidden gates' n part (with its bias).
#include <ATen/TensorOperators.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>

#include <optional>
#include <tuple>
#include <vector>

#include "AccelNativeFunctions.h"
#include "aten/host_task.h"
#include "device/common.h"

namespace accel::aten {
namespace {

using device::kAccel;

// Checks the cell's tensors (accel, one device, one dtype) and returns their device.
c10::DeviceIndex check_cell(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  const at::Tensor& first = **tensors.begin();
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->device().type() == kAccel, op, ": expected accel tensors, got one on ",
                t->device());
    TORCH_CHECK(t->device() == first.device(), op, ": tensors on ", first.device(), " and ",
                t->device());
    TORCH_CHECK(t->scalar_type() == first.scalar_type(), op, ": tensors of dtypes ",
                first.scalar_type(), " and ", t->scalar_type());
  }
  return first.device().index();
}

void check_size(const char* op, const char* what, const at::Tensor& t, c10::IntArrayRef expected) {
  if (!t.defined()) return;
  TORCH_CHECK(t.sizes() == expected, op, ": ", what, " has size ", t.sizes(), ", expected ",
              expected);
}

std::optional<Layout> layout_of(const std::optional<at::Tensor>& t) {
  if (!t || !t->defined()) return std::nullopt;
  return Layout::of(*t);
}

// The CPU view of an argument inside the task, in float for half and bfloat16.
at::Tensor compute_view(const Layout& l) {
  at::Tensor v = l.cpu_view();
  return at::isReducedFloatingType(v.scalar_type()) ? v.to(at::kFloat) : v;
}

at::Tensor compute_view(const std::optional<Layout>& l) {
  return l ? compute_view(*l) : at::Tensor();
}

at::Tensor new_result(const at::Tensor& like, c10::IntArrayRef sizes) {
  return at::empty(sizes, like.options().memory_format(c10::MemoryFormat::Contiguous));
}

// Runs `f` as a task on the current stream of `device`, with autograd and the ADInplaceOrView
// key off (the task's CPU operators are not part of the caller's graph).
template <class F>
void run_cell(c10::DeviceIndex device, const char* op, F f) {
  launch(device, op, [f = std::move(f)] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    f();
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> _thnn_fused_lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  constexpr const char* op = "_thnn_fused_lstm_cell";
  const at::Tensor& b_ih = input_bias ? *input_bias : at::Tensor();
  const at::Tensor& b_hh = hidden_bias ? *hidden_bias : at::Tensor();
  const c10::DeviceIndex device = check_cell(op, {&input_gates, &hidden_gates, &cx, &b_ih, &b_hh});
  TORCH_CHECK(cx.dim() == 2, op, ": cx must be 2-d (batch, hidden), got ", cx.sizes());
  const int64_t batch = cx.size(0);
  const int64_t hidden = cx.size(1);
  check_size(op, "input_gates", input_gates, {batch, 4 * hidden});
  check_size(op, "hidden_gates", hidden_gates, {batch, 4 * hidden});
  check_size(op, "input_bias", b_ih, {4 * hidden});
  check_size(op, "hidden_bias", b_hh, {4 * hidden});
  TORCH_CHECK(b_ih.defined() == b_hh.defined(), op, ": both biases or neither");

  at::Tensor hy = new_result(cx, {batch, hidden});
  at::Tensor cy = new_result(cx, {batch, hidden});
  at::Tensor workspace = new_result(cx, {batch, 4 * hidden});
  if (batch * hidden == 0) return {hy, cy, workspace};
  run_cell(device, op,
           [ig = Layout::of(input_gates), hg = Layout::of(hidden_gates), c = Layout::of(cx),
            bi = layout_of(input_bias), bh = layout_of(hidden_bias), h_out = Layout::of(hy),
            c_out = Layout::of(cy), ws = Layout::of(workspace)] {
             at::Tensor gates = compute_view(ig) + compute_view(hg);
             if (bi) gates = gates + compute_view(bi) + compute_view(bh);
             const std::vector<at::Tensor> g = gates.chunk(4, 1);
             const at::Tensor i = at::sigmoid(g[0]);
             const at::Tensor f = at::sigmoid(g[1]);
             const at::Tensor cell = at::tanh(g[2]);
             const at::Tensor o = at::sigmoid(g[3]);
             const at::Tensor c_new = f * compute_view(c) + i * cell;
             c_out.cpu_view().copy_(c_new);
             h_out.cpu_view().copy_(o * at::tanh(c_new));
             ws.cpu_view().copy_(at::cat({i, f, cell, o}, 1));
           });
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> _thnn_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  constexpr const char* op = "_thnn_fused_lstm_cell_backward_impl";
  const at::Tensor& ghy = grad_hy ? *grad_hy : at::Tensor();
  const at::Tensor& gcy = grad_cy ? *grad_cy : at::Tensor();
  if (!ghy.defined() && !gcy.defined()) return {};
  const c10::DeviceIndex device = check_cell(op, {&cx, &cy, &workspace, &ghy, &gcy});
  TORCH_CHECK(cx.dim() == 2, op, ": cx must be 2-d (batch, hidden), got ", cx.sizes());
  const int64_t batch = cx.size(0);
  const int64_t hidden = cx.size(1);
  check_size(op, "cy", cy, {batch, hidden});
  check_size(op, "grad_hy", ghy, {batch, hidden});
  check_size(op, "grad_cy", gcy, {batch, hidden});
  check_size(op, "workspace", workspace, {batch, 4 * hidden});

  at::Tensor grad_gates = new_result(cx, {batch, 4 * hidden});
  at::Tensor grad_cx = new_result(cx, {batch, hidden});
  at::Tensor grad_bias = has_bias ? new_result(cx, {4 * hidden}) : at::Tensor();
  run_cell(device, op,
           [gh = layout_of(grad_hy), gc = layout_of(grad_cy), c = Layout::of(cx),
            c_new = Layout::of(cy), ws = Layout::of(workspace), gg_out = Layout::of(grad_gates),
            gcx_out = Layout::of(grad_cx), gb_out = Layout::of(grad_bias)] {
             const std::vector<at::Tensor> g = compute_view(ws).chunk(4, 1);
             const at::Tensor &i = g[0], &f = g[1], &cell = g[2], &o = g[3];
             const at::Tensor t = at::tanh(compute_view(c_new));
             at::Tensor d_c = gc ? compute_view(gc) : at::zeros_like(t);
             at::Tensor d_o = at::zeros_like(t);
             if (gh) {
               const at::Tensor d_h = compute_view(gh);
               d_o = d_h * t * (1 - o) * o;
               d_c = d_c + d_h * o * (1 - t * t);
             }
             const at::Tensor d_i = d_c * cell * (1 - i) * i;
             const at::Tensor d_f = d_c * compute_view(c) * (1 - f) * f;
             const at::Tensor d_g = d_c * i * (1 - cell * cell);
             const at::Tensor gates = at::cat({d_i, d_f, d_g, d_o}, 1);
             gg_out.cpu_view().copy_(gates);
             gcx_out.cpu_view().copy_(d_c * f);
             if (gb_out.dtype != c10::ScalarType::Undefined) {
               gb_out.cpu_view().copy_(at::sum(gates, 0));
             }
           });
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> _thnn_fused_gru_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  constexpr const char* op = "_thnn_fused_gru_cell";
  const at::Tensor& b_ih = input_bias ? *input_bias : at::Tensor();
  const at::Tensor& b_hh = hidden_bias ? *hidden_bias : at::Tensor();
  const c10::DeviceIndex device = check_cell(op, {&input_gates, &hidden_gates, &hx, &b_ih, &b_hh});
  TORCH_CHECK(hx.dim() == 2, op, ": hx must be 2-d (batch, hidden), got ", hx.sizes());
  const int64_t batch = hx.size(0);
  const int64_t hidden = hx.size(1);
  check_size(op, "input_gates", input_gates, {batch, 3 * hidden});
  check_size(op, "hidden_gates", hidden_gates, {batch, 3 * hidden});
  check_size(op, "input_bias", b_ih, {3 * hidden});
  check_size(op, "hidden_bias", b_hh, {3 * hidden});
  TORCH_CHECK(b_ih.defined() == b_hh.defined(), op, ": both biases or neither");

  at::Tensor hy = new_result(hx, {batch, hidden});
  at::Tensor workspace = new_result(hx, {batch, 5 * hidden});
  if (batch * hidden == 0) return {hy, workspace};
  run_cell(device, op,
           [ig = Layout::of(input_gates), hg = Layout::of(hidden_gates), h = Layout::of(hx),
            bi = layout_of(input_bias), bh = layout_of(hidden_bias), h_out = Layout::of(hy),
            ws = Layout::of(workspace)] {
             at::Tensor in = compute_view(ig);
             at::Tensor hid = compute_view(hg);
             if (bi) {
               in = in + compute_view(bi);
               hid = hid + compute_view(bh);
             }
             const std::vector<at::Tensor> a = in.chunk(3, 1);
             const std::vector<at::Tensor> b = hid.chunk(3, 1);
             const at::Tensor r = at::sigmoid(a[0] + b[0]);
             const at::Tensor z = at::sigmoid(a[1] + b[1]);
             const at::Tensor n = at::tanh(a[2] + r * b[2]);
             const at::Tensor h_prev = compute_view(h);
             h_out.cpu_view().copy_(n + z * (h_prev - n));
             ws.cpu_view().copy_(at::cat({r, z, n, h_prev, b[2]}, 1));
           });
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
_thnn_fused_gru_cell_backward(const at::Tensor& grad_hy, const at::Tensor& workspace,
                              bool has_bias) {
  constexpr const char* op = "_thnn_fused_gru_cell_backward";
  const c10::DeviceIndex device = check_cell(op, {&grad_hy, &workspace});
  TORCH_CHECK(grad_hy.dim() == 2, op, ": grad_hy must be 2-d (batch, hidden), got ",
              grad_hy.sizes());
  const int64_t batch = grad_hy.size(0);
  const int64_t hidden = grad_hy.size(1);
  check_size(op, "workspace", workspace, {batch, 5 * hidden});

  at::Tensor grad_input = new_result(grad_hy, {batch, 3 * hidden});
  at::Tensor grad_hidden = new_result(grad_hy, {batch, 3 * hidden});
  at::Tensor grad_hx = new_result(grad_hy, {batch, hidden});
  at::Tensor grad_b_ih = has_bias ? new_result(grad_hy, {3 * hidden}) : at::Tensor();
  at::Tensor grad_b_hh = has_bias ? new_result(grad_hy, {3 * hidden}) : at::Tensor();
  run_cell(device, op,
           [gh = Layout::of(grad_hy), ws = Layout::of(workspace), gi_out = Layout::of(grad_input),
            gh_out = Layout::of(grad_hidden), ghx_out = Layout::of(grad_hx),
            gbi_out = Layout::of(grad_b_ih), gbh_out = Layout::of(grad_b_hh)] {
             const std::vector<at::Tensor> w = compute_view(ws).chunk(5, 1);
             const at::Tensor &r = w[0], &z = w[1], &n = w[2], &h_prev = w[3], &hn = w[4];
             const at::Tensor d_h = compute_view(gh);
             const at::Tensor d_z = d_h * (h_prev - n) * (1 - z) * z;
             const at::Tensor d_in = d_h * (1 - z) * (1 - n * n);
             const at::Tensor d_hn = d_in * r;
             const at::Tensor d_r = d_in * hn * (1 - r) * r;
             const at::Tensor d_input = at::cat({d_r, d_z, d_in}, 1);
             const at::Tensor d_hidden = at::cat({d_r, d_z, d_hn}, 1);
             gi_out.cpu_view().copy_(d_input);
             gh_out.cpu_view().copy_(d_hidden);
             ghx_out.cpu_view().copy_(d_h * z);
             if (gbi_out.dtype != c10::ScalarType::Undefined) {
               gbi_out.cpu_view().copy_(at::sum(d_input, 0));
               gbh_out.cpu_view().copy_(at::sum(d_hidden, 0));
             }
           });
  return {grad_input, grad_hidden, grad_hx, grad_b_ih, grad_b_hh};
}

}  // namespace accel::aten
