"""The underlying tier's convolutions: ATen's CPU kernels (oneDNN) on accel memory, forward and
backward, against the CPU, with the result layouts torch.compile's fake kernels promise, and
the oneDNN defects accel steps around (csrc/aten/convolution.cpp)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import assert_same


def test_conv2d_backward_matches_cpu(no_fallback: None) -> None:
    g = torch.Generator().manual_seed(4)
    x0, w0, b0 = torch.randn(2, 3, 9, 9, generator=g), torch.randn(4, 3, 3, 3, generator=g), None
    b0 = torch.randn(4, generator=g)
    res = {}
    for dev in ("cpu", "accel"):
        x, w, b = (t.to(dev).detach().requires_grad_() for t in (x0, w0, b0))
        y = F.max_pool2d(F.conv2d(x, w, b, stride=2, padding=1), 2)
        y.square().sum().backward()
        res[dev] = (y.detach(), x.grad, w.grad, b.grad)
    for a, c in zip(res["accel"], res["cpu"], strict=True):
        assert_same(a, c, exact=False)


def test_conv_results_have_the_layout_torch_compile_expects(no_fallback: None) -> None:
    # PyTorch's fake and meta convolutions give accel (ATen's overrideable backend) contiguous
    # results; the CPU kernel underneath gives channels-last ones for channels-last arguments.
    # Compiled code checks the fake layout (a ConvNeXt block failed), so accel's are contiguous.
    from torch._subclasses.fake_tensor import FakeTensorMode

    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(2, 8, 6, 6, generator=g).contiguous(memory_format=torch.channels_last)
    for w0, groups in (
        (torch.randn(8, 1, 3, 3, generator=g), 8),
        (torch.randn(4, 8, 3, 3, generator=g), 1),
    ):
        w0 = w0.contiguous(memory_format=torch.channels_last)
        grad0 = torch.randn(2, w0.shape[0], 6, 6, generator=g)
        args = ([1, 1], [1, 1], [1, 1], False, [0, 0], groups)
        x, w, grad = x0.to("accel"), w0.to("accel"), grad0.to("accel")
        fake = FakeTensorMode()
        fx, fw, fg = fake.from_tensor(x), fake.from_tensor(w), fake.from_tensor(grad)
        with fake:
            f_out = torch.ops.aten.convolution(fx, fw, None, *args)
            f_gx, f_gw, _ = torch.ops.aten.convolution_backward(
                fg, fx, fw, [w0.shape[0]], *args, [True, True, True]
            )
        for _ in range(2):  # the first call runs on the caller, later ones as stream tasks
            out = torch.ops.aten.convolution(x, w, None, *args)
            gx, gw, gb = torch.ops.aten.convolution_backward(
                grad, x, w, [w0.shape[0]], *args, [True, True, True]
            )
            assert out.stride() == f_out.stride() and gx.stride() == f_gx.stride()
            assert gw.is_contiguous() and f_gw.is_contiguous()
            ref = torch.ops.aten.convolution(x0, w0, None, *args)
            ref_grads = torch.ops.aten.convolution_backward(
                grad0, x0, w0, [w0.shape[0]], *args, [True, True, True]
            )
            assert_same(out, ref, exact=False)
            for a, c in zip((gx, gw, gb), ref_grads, strict=True):
                assert_same(a, c, exact=False)


_SMALL_STRIDED_1X1 = """
import torch, torch_accel
torch.manual_seed(0)
CL = torch.channels_last
x0 = torch.randn(2, 3, 224, 224, dtype=torch.float64)
w0 = torch.randn(48, 3, 1, 1, dtype=torch.float64)
g0 = torch.randn(2, 48, 112, 112, dtype=torch.float64)
args = ([48], [2, 2], [0, 0], [1, 1], False, [0, 0], 1)
# float64 on the CPU: no oneDNN, the reference
_, ref_w, ref_b = torch.ops.aten.convolution_backward(g0, x0, w0, *args, [True, True, True])
for x_cl, w_cl in ((True, False), (False, True), (True, True)):
    x = x0.float().to("accel", memory_format=CL if x_cl else torch.contiguous_format)
    w = w0.float().to("accel", memory_format=CL if w_cl else torch.contiguous_format)
    g = g0.float().to("accel")
    for mask in ([False, True, False], [True, True, True]):
        _, gw, gb = torch.ops.aten.convolution_backward(g, x, w, *args, mask)
        torch.testing.assert_close(gw.cpu().double(), ref_w, rtol=1e-4, atol=1e-3)
        if mask[2]:
            torch.testing.assert_close(gb.cpu().double(), ref_b, rtol=1e-4, atol=1e-3)
# A channels-last model's image stem, eagerly: the weight gradient comes from the same call.
conv = torch.nn.Conv2d(3, 48, 1, stride=2, bias=False).to("accel", memory_format=CL)
with torch.no_grad():
    conv.weight.copy_(w0.float())
(conv(x0.float().to("accel", memory_format=CL)) * g0.float().to("accel")).sum().backward()
torch.testing.assert_close(conv.weight.grad.cpu().double(), ref_w, rtol=1e-4, atol=1e-3)
torch.accel.synchronize()
print("ok")
"""


def test_small_strided_1x1_weight_gradients_do_not_corrupt_memory(run_python) -> None:  # noqa: ANN001
    # The CPU's oneDNN kernel writes past its workspace for these (uxlfoundation/oneDNN#6035): the
    # CPU crashes or corrupts its heap; accel runs them with contiguous tensors
    # (csrc/aten/convolution.cpp). glibc's heap checks make a stray write fail the run.
    r = run_python(_SMALL_STRIDED_1X1, MALLOC_CHECK_="3", GLIBC_TUNABLES="glibc.malloc.check=3")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok")


@pytest.mark.parametrize(
    ("kernel", "dtype", "channels_last"),
    [
        (7, torch.float32, False),  # ConvNeXt's depthwise convolution
        (7, torch.float32, True),  # ... after its LayerNorm2d (a permute: channels-last strides)
        (5, torch.bfloat16, False),  # EfficientNet's, in bfloat16
        (3, torch.float32, True),  # 3x3: keeps its layout
    ],
)
def test_depthwise_convolutions_match_the_cpu_with_contiguous_results(
    kernel: int, dtype: torch.dtype, channels_last: bool, no_fallback: None
) -> None:
    """Depthwise convolutions with 5x5 kernels and more run on channels-last copies of their
    arguments (oneDNN's faster path for them, csrc/aten/convolution.cpp); the results, forward
    and backward, are contiguous whatever the arguments' layout (as the fake kernels say; the
    input's gradient then takes the input's layout, as autograd gives every leaf) and match the
    CPU's, against a float64 reference as closely as the CPU's own."""
    torch.manual_seed(0)
    conv = nn.Conv2d(24, 24, kernel, padding=kernel // 2, groups=24)
    x = torch.randn(4, 24, 12, 12)
    g = torch.randn(4, 24, 12, 12)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def run(device: str, dt: torch.dtype) -> tuple[torch.Tensor, ...]:
        c = copy.deepcopy(conv).to(device, dt)
        xi = x.to(device, dt, copy=True).contiguous(memory_format=fmt).requires_grad_()
        y = c(xi)
        y.backward(g.to(device, dt))
        return y, xi.grad, c.weight.grad, c.bias.grad

    got, cpu, exact = run("accel", dtype), run("cpu", dtype), run("cpu", torch.float64)
    names = ("output", "input grad", "weight grad", "bias grad")
    for name, a, b, e in zip(names, got, cpu, exact, strict=True):
        assert a.device.type == "accel", name
        if name == "input grad":  # autograd gives a leaf's gradient the leaf's layout
            assert a.stride() == b.stride(), name
        else:
            assert a.is_contiguous(), name
        error = (a.cpu().double() - e).abs().max().item()
        cpu_error = (b.double() - e).abs().max().item()
        scale = e.abs().max().item() * (1e-6 if dtype == torch.float32 else 1e-2)
        assert error <= 4 * cpu_error + scale, f"{name}: {error} against the CPU's {cpu_error}"


def test_depthwise_convolution_to_one_pixel_has_the_cpus_strides(no_fallback: None) -> None:
    # A 5x5 depthwise convolution whose output is 1x1 (EfficientNet's and MobileNetV3's late
    # layers at small inputs) runs channels-last; its [N, C, 1, 1] result came back with
    # channels-last strides, contiguous as well for is_contiguous(), and the next CPU kernel
    # (batch norm's backward) took its channels-last path: gradients 1.4e-6 from the CPU's (bit
    # for bit with one thread).
    torch.manual_seed(0)
    x, w = torch.randn(6, 96, 2, 2), torch.randn(96, 1, 5, 5)
    bw, bb, g = torch.randn(96), torch.randn(96), torch.randn(6, 96, 1, 1)
    grads, strides = [], []
    for device in ("cpu", "accel"):
        xi = x.to(device, copy=True).requires_grad_()
        y = F.conv2d(xi, w.to(device), stride=2, padding=2, groups=96)
        strides.append(y.stride())
        F.batch_norm(y, None, None, bw.to(device), bb.to(device), training=True).backward(
            g.to(device)
        )
        grads.append(xi.grad.cpu())
    assert strides[1] == strides[0] == (96, 1, 1, 1)
    # (Within float32's tolerance only where the CPU's call here splits batch norm's reductions
    # over several threads: accel runs such small calls on one.)
    torch.testing.assert_close(grads[1], grads[0])
