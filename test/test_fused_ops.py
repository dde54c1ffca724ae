"""accel's own fused operators (torch.ops.accel.*, torch_accel.ops): values and gradients against
the unfused PyTorch composition on the CPU, odd and non-contiguous shapes, errors naming the bad
argument, PyTorch's own operator checks (torch.library.opcheck), autocast and torch.compile."""

from __future__ import annotations

import pytest
import torch

import torch_accel
from torch_accel.ops import qkv_rms_norm_rope, rms_norm_rope

pytestmark = pytest.mark.skipif(
    torch_accel.executor()[0] != "host",
    reason="the fused kernels exist for the host driver (cuda: issue 12's Triton kernels)",
)

TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
}


# --- the unfused composition, as HF's Llama/Qwen3 code writes it ------------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def reference(x, weight, cos, sin, eps=1e-6, interleaved=False):  # type: ignore[no-untyped-def]
    """RMSNorm over the last dim (in float32, as Qwen3RMSNorm) then the rotary embedding; cos
    (..., seq, d) gets a heads dim to broadcast against x (..., seq, heads, d)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    c, s = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2)
    rot = rotate_every_two(y) if interleaved else rotate_half(y)
    return (y * c + rot * s).to(x.dtype)


def on(device: str, *tensors: torch.Tensor, grad: bool = False) -> list[torch.Tensor]:
    return [t.detach().to(device).requires_grad_(grad) for t in tensors]


SHAPES = [
    # (lead dims, seq, heads, head_dim, cos lead dims)
    ((2,), 5, 3, 8, ()),
    ((), 7, 1, 6, ()),
    ((1,), 1, 4, 2, ()),
    ((3,), 9, 2, 64, (3,)),
    ((2, 2), 3, 5, 10, (1, 2)),
    ((1,), 17, 8, 128, (1,)),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rms_norm_rope_values_and_gradients_fp32(shape, interleaved):  # type: ignore[no-untyped-def]
    lead, seq, heads, d, cos_lead = shape
    torch.manual_seed(0)
    x = torch.randn(*lead, seq, heads, d)
    w = torch.randn(d)
    cos, sin = torch.randn(*cos_lead, seq, d), torch.randn(*cos_lead, seq, d)
    g = torch.randn_like(x)
    xc, wc, cc, sc = on("cpu", x, w, cos, sin, grad=True)
    expected = reference(xc, wc, cc, sc, 1e-5, interleaved)
    expected.backward(g)
    xa, wa, ca, sa = on("accel", x, w, cos, sin, grad=True)
    out = rms_norm_rope(xa, wa, ca, sa, 1e-5, interleaved)
    assert out.device.type == "accel" and out.dtype == x.dtype and out.is_contiguous()
    out.backward(g.to("accel"))
    torch.testing.assert_close(out.cpu(), expected.detach(), **TOL[torch.float32])
    for a, e in ((xa, xc), (wa, wc), (ca, cc), (sa, sc)):
        torch.testing.assert_close(a.grad.cpu(), e.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_rope_reduced_precision(dtype):  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    x = torch.randn(2, 11, 4, 64).to(dtype)
    w = (1 + 0.1 * torch.randn(64)).to(dtype)
    cos, sin = torch.randn(11, 64), torch.randn(11, 64)  # float32 tables, as HF keeps them
    xa, wa = on("accel", x, w, grad=True)
    out = rms_norm_rope(xa, wa, cos.to("accel"), sin.to("accel"))
    assert out.dtype == dtype
    # The composition in float32, rounded once: the fused kernel's numbers.
    torch.testing.assert_close(
        out.cpu(), reference(x.float(), w.float(), cos, sin).to(dtype), **TOL[dtype]
    )
    g = torch.randn(out.shape).to(dtype)
    out.backward(g.to("accel"))
    xf, wf = on("cpu", x.float(), w.float(), grad=True)
    reference(xf, wf, cos, sin).backward(g.float())
    assert xa.grad.dtype == dtype and wa.grad.dtype == dtype
    torch.testing.assert_close(xa.grad.cpu().float(), xf.grad, atol=0.1, rtol=0.05)
    torch.testing.assert_close(wa.grad.cpu().float(), wf.grad, atol=0.5, rtol=0.05)


def test_rms_norm_rope_non_contiguous_inputs():
    torch.manual_seed(2)
    # x as Qwen3 has it before the transpose: a view of (batch, heads, seq, d) memory.
    base = torch.randn(2, 6, 9, 16)
    x = base.transpose(1, 2)  # (2, 9, 6, 16), not contiguous
    w = torch.randn(32)[::2]  # strided weight
    cos = torch.randn(16, 9).t()  # last dim not contiguous
    sin = torch.randn(9, 16)
    expected = reference(x, w, cos, sin)
    xa = base.to("accel").transpose(1, 2)
    wa = torch.randn(32).to("accel")
    wa.copy_(torch.cat([w.unsqueeze(1), torch.zeros(16, 1)], 1).flatten())
    out = rms_norm_rope(xa, wa[::2], cos.t().contiguous().to("accel").t(), sin.to("accel"))
    torch.testing.assert_close(out.cpu(), expected, **TOL[torch.float32])
    # A last dim with stride 2.
    wide = torch.randn(2, 9, 6, 32)
    x2 = wide[..., ::2]
    out2 = rms_norm_rope(
        wide.to("accel")[..., ::2], w.to("accel"), cos.to("accel"), sin.to("accel")
    )
    torch.testing.assert_close(out2.cpu(), reference(x2, w, cos, sin), **TOL[torch.float32])


def test_rms_norm_rope_on_cpu_tensors_matches_accel():
    torch.manual_seed(3)
    x, w = torch.randn(2, 4, 3, 32), torch.randn(32)
    cos, sin = torch.randn(4, 32), torch.randn(4, 32)
    cpu = torch.ops.accel.rms_norm_rope(x, w, cos, sin)
    acc = torch.ops.accel.rms_norm_rope(*on("accel", x, w, cos, sin))
    torch.testing.assert_close(acc.cpu(), cpu, rtol=0, atol=0)
    torch.testing.assert_close(cpu, reference(x, w, cos, sin), **TOL[torch.float32])


def test_rms_norm_rope_runs_in_stream_order():
    """Fed by a matmul and called in a loop without synchronizing, as eager ops are."""
    torch.manual_seed(4)
    a, b = torch.randn(64, 96), torch.randn(96, 4 * 32)
    w, cos, sin = torch.randn(32), torch.randn(64, 32), torch.randn(64, 32)
    aa, ba, wa, ca, sa = on("accel", a, b, w, cos, sin)
    outs = []
    for i in range(5):
        x = (aa @ ba + i).view(1, 64, 4, 32)
        outs.append(rms_norm_rope(x, wa, ca, sa))
    for i, out in enumerate(outs):
        expected = reference((a @ b + i).view(1, 64, 4, 32), w, cos, sin)
        torch.testing.assert_close(out.cpu(), expected, **TOL[torch.float32])


def qkv_reference(qkv, qw, kw, cos, sin, hq, hkv, eps=1e-6):  # type: ignore[no-untyped-def]
    """Qwen3's attention up to the rotary embedding, on a fused projection's output."""
    d = qkv.shape[-1] // (hq + 2 * hkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q = reference(q.unflatten(-1, (hq, d)), qw, cos, sin, eps).transpose(-3, -2)
    k = reference(k.unflatten(-1, (hkv, d)), kw, cos, sin, eps).transpose(-3, -2)
    return q, k, v.unflatten(-1, (hkv, d)).transpose(-3, -2)


@pytest.mark.parametrize(
    "shape",
    [((2,), 5, 4, 2, 8), ((), 3, 2, 2, 6), ((1,), 33, 8, 1, 64), ((2, 1), 4, 6, 3, 16)],
    ids=str,
)
def test_qkv_rms_norm_rope_values_and_gradients(shape):  # type: ignore[no-untyped-def]
    lead, seq, hq, hkv, d = shape
    torch.manual_seed(5)
    qkv = torch.randn(*lead, seq, (hq + 2 * hkv) * d)
    qw, kw = torch.randn(d), torch.randn(d)
    cos, sin = torch.randn(seq, d), torch.randn(seq, d)
    grads = [torch.randn(*lead, h, seq, d) for h in (hq, hkv, hkv)]
    cpu = on("cpu", qkv, qw, kw, cos, sin, grad=True)
    expected = qkv_reference(*cpu, hq, hkv)
    torch.autograd.backward(expected, grads)
    acc = on("accel", qkv, qw, kw, cos, sin, grad=True)
    out = qkv_rms_norm_rope(*acc, hq, hkv)
    for o, e in zip(out, expected, strict=True):
        assert o.shape == e.shape and o.is_contiguous()
        torch.testing.assert_close(o.cpu(), e.detach(), **TOL[torch.float32])
    torch.autograd.backward(out, [g.to("accel") for g in grads])
    for a, e in zip(acc, cpu, strict=True):
        torch.testing.assert_close(a.grad.cpu(), e.grad, atol=1e-4, rtol=1e-4)


def test_qkv_rms_norm_rope_with_unused_outputs_and_batched_cos():
    """Only q and v reach the loss (k's gradient is undefined); cos has a batch dim."""
    torch.manual_seed(6)
    hq, hkv, d, seq = 4, 2, 16, 7
    qkv = torch.randn(3, seq, (hq + 2 * hkv) * d).to(torch.bfloat16)
    qw, kw = torch.randn(d), torch.randn(d)
    cos, sin = torch.randn(3, seq, d), torch.randn(3, seq, d)
    cpu = on("cpu", qkv.float(), qw, kw, cos, sin, grad=True)
    q, _, v = qkv_reference(*cpu, hq, hkv)
    (q.sum() + (v * 2).sum()).backward()
    acc = on("accel", qkv, qw, kw, cos, sin, grad=True)
    qa, ka, va = qkv_rms_norm_rope(*acc, hq, hkv)
    assert qa.dtype == ka.dtype == va.dtype == torch.bfloat16
    (qa.float().sum() + (va.float() * 2).sum()).backward()
    torch.testing.assert_close(acc[0].grad.cpu().float(), cpu[0].grad, atol=5e-2, rtol=2e-2)
    torch.testing.assert_close(acc[1].grad.cpu(), cpu[1].grad, atol=0.5, rtol=2e-2)
    assert torch.count_nonzero(acc[2].grad.cpu()) == 0  # k_weight: k took no part


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda a: rms_norm_rope(a(2, 3, 5), a(5), a(2, 5), a(2, 5)),
            RuntimeError,
            "head dim must be even",
        ),
        (
            lambda a: rms_norm_rope(a(2, 3, 4), a(3), a(2, 4), a(2, 4)),
            RuntimeError,
            r"weight must have shape \(4,\)",
        ),
        (
            lambda a: rms_norm_rope(a(2, 3, 4), a(4), a(3, 4), a(3, 4)),
            RuntimeError,
            r"cos and sin must have shape \(seq, head_dim\)",
        ),
        (
            lambda a: rms_norm_rope(a(2, 3, 4), a(4), a(2, 4), a(2, 2)),
            RuntimeError,
            "cos and sin must have one shape",
        ),
        (
            lambda a: rms_norm_rope(a(3, 4), a(4), a(3, 4), a(3, 4)),
            RuntimeError,
            r"\(\.\.\., seq, heads, head_dim\)",
        ),
        (
            lambda a: rms_norm_rope(a(2, 3, 4).double(), a(4), a(2, 4), a(2, 4)),
            NotImplementedError,
            "Double is not supported",
        ),
        (
            lambda a: rms_norm_rope(a(2, 3, 4), torch.ones(4), a(2, 4), a(2, 4)),
            RuntimeError,
            "weight is on cpu",
        ),
        (
            lambda a: qkv_rms_norm_rope(a(2, 30), a(5), a(5), a(2, 5), a(2, 5), 4, 3),
            RuntimeError,
            "positive multiple of num_kv_heads",
        ),
        (
            lambda a: qkv_rms_norm_rope(a(2, 32), a(6), a(6), a(2, 6), a(2, 6), 2, 2),
            RuntimeError,
            "is not num_q_heads",
        ),
    ],
)
def test_errors_name_the_bad_argument(call, error, match):  # type: ignore[no-untyped-def]
    def a(*sizes: int) -> torch.Tensor:
        return torch.randn(*sizes, device="accel")

    with pytest.raises(error, match=match):
        call(a)
    torch.testing.assert_close((a(3) * 0).cpu(), torch.zeros(3))  # the device still works


@pytest.mark.parametrize("device", ["cpu", "accel"])
def test_opcheck(device):  # type: ignore[no-untyped-def]
    """PyTorch's own checks of a custom operator: schema, fake kernel, autograd registration,
    AOT dispatch. (torch 2.11's autograd-registration check knows CPU, CUDA and XPU only: on
    accel it is the CPU run that covers it.)"""
    torch.manual_seed(7)
    x, w = torch.randn(2, 5, 3, 8, device=device), torch.randn(8, device=device)
    cos, sin = torch.randn(5, 8, device=device), torch.randn(5, 8, device=device)
    utils: tuple[str, ...] = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    if device == "cpu":
        utils += ("test_autograd_registration",)
    x.requires_grad_()
    torch.library.opcheck(torch.ops.accel.rms_norm_rope, (x, w, cos, sin), test_utils=utils)
    qkv = torch.randn(2, 5, 6 * 8, device=device, requires_grad=True)
    args = (qkv, w, w.clone(), cos, sin, 4, 1)
    torch.library.opcheck(torch.ops.accel.qkv_rms_norm_rope, args, test_utils=utils)


def test_autocast_keeps_the_activations_dtype():
    torch.manual_seed(8)
    lin = torch.nn.Linear(32, 4 * 16).to("accel")
    w, cos, sin = torch.randn(16), torch.randn(6, 16), torch.randn(6, 16)
    x = torch.randn(2, 6, 32)
    with torch.autocast("accel", dtype=torch.bfloat16):
        h = lin(x.to("accel")).view(2, 6, 4, 16)
        out = rms_norm_rope(h, w.to("accel"), cos.to("accel"), sin.to("accel"))
    assert h.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    expected = reference(h.float().cpu(), w, cos, sin)
    torch.testing.assert_close(out.cpu().float(), expected, **TOL[torch.bfloat16])


# --- linear_act ---------------------------------------------------------------------------------

ACTIVATIONS = {
    "none": lambda t: t,
    "relu": torch.nn.functional.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


@pytest.mark.parametrize("kernel", ["fused", "aten", "auto"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_linear_act_values_and_gradients(kernel, activation, bias):  # type: ignore[no-untyped-def]
    from torch_accel.ops import linear_act, linear_kernel

    torch.manual_seed(9)
    x, w = torch.randn(3, 7, 33), torch.randn(17, 33)
    b = torch.randn(17) if bias else None
    cpu = on("cpu", *[t for t in (x, w, b) if t is not None], grad=True)
    expected = ACTIVATIONS[activation](
        torch.nn.functional.linear(cpu[0], cpu[1], cpu[2] if bias else None)
    )
    g = torch.randn(expected.shape)
    expected.backward(g)
    acc = on("accel", *[t for t in (x, w, b) if t is not None], grad=True)
    with linear_kernel(kernel):
        out = linear_act(acc[0], acc[1], acc[2] if bias else None, activation)
        out.backward(g.to("accel"))
    torch.testing.assert_close(out.cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    for a, e in zip(acc, cpu, strict=True):
        torch.testing.assert_close(a.grad.cpu(), e.grad, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("activation", ["gelu", "silu", "relu"])
def test_linear_act_bf16_and_non_contiguous(activation):  # type: ignore[no-untyped-def]
    """bf16 within bf16 tolerance, x a transposed view, weight a slice; both kernels agree."""
    from torch_accel.ops import linear_act, linear_kernel

    torch.manual_seed(10)
    x = torch.randn(40, 6, 64).transpose(0, 1)  # (6, 40, 64), not contiguous
    w = torch.randn(96, 128)[:, ::2]  # (96, 64), strided
    b = torch.randn(96)
    expected = ACTIVATIONS[activation](torch.nn.functional.linear(x, w, b))
    outs = {}
    for kernel in ("fused", "aten"):
        with linear_kernel(kernel):
            xa = torch.empty(40, 6, 64, device="accel", dtype=torch.bfloat16).transpose(0, 1)
            xa.copy_(x)
            wa = torch.randn(96, 128).to("accel", torch.bfloat16)[:, ::2]
            wa.copy_(w)
            outs[kernel] = linear_act(xa, wa, b.to("accel", torch.bfloat16), activation)
        assert outs[kernel].dtype == torch.bfloat16 and outs[kernel].shape == (6, 40, 96)
        torch.testing.assert_close(outs[kernel].cpu().float(), expected, atol=0.25, rtol=0.03)
    torch.testing.assert_close(outs["fused"].cpu(), outs["aten"].cpu(), atol=0.1, rtol=0.02)


def test_linear_act_direct_op_gradients_and_nan():
    """torch.ops.accel.linear_act itself has autograd (recomputing the pre-activation); NaN
    propagates through every activation as in eager."""
    from torch_accel.ops import linear_kernel

    torch.manual_seed(11)
    x, w = torch.randn(5, 8), torch.randn(4, 8)
    xa, wa = on("accel", x, w, grad=True)
    torch.ops.accel.linear_act(xa, wa, None, "silu").sum().backward()
    xc, wc = on("cpu", x, w, grad=True)
    torch.nn.functional.silu(xc @ wc.t()).sum().backward()
    torch.testing.assert_close(xa.grad.cpu(), xc.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wa.grad.cpu(), wc.grad, atol=1e-5, rtol=1e-5)
    x[1, 3] = float("nan")
    with linear_kernel("fused"):
        for name, f in ACTIVATIONS.items():
            out = torch.ops.accel.linear_act(x.to("accel"), w.to("accel"), None, name).cpu()
            torch.testing.assert_close(out, f(x @ w.t()), equal_nan=True, atol=1e-5, rtol=1e-5)


def test_linear_kernel_choice_and_errors(monkeypatch):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from torch_accel.ops import get_linear_kernel, linear_act, linear_kernel

    assert get_linear_kernel() == "auto"
    with linear_kernel("fused"):
        assert get_linear_kernel() == "fused"
    assert get_linear_kernel() == "auto"
    with pytest.raises(ValueError, match="one of auto, fused, aten"):
        with linear_kernel("fast"):
            pass
    x, w = torch.randn(2, 4, device="accel"), torch.randn(3, 4, device="accel")
    with pytest.raises(RuntimeError, match="unknown activation 'tanh'"):
        linear_act(x, w, None, "tanh")
    with pytest.raises(RuntimeError, match=r"x has 4 features but weight is \[3, 5\]"):
        linear_act(x, torch.randn(3, 5, device="accel"))
    with pytest.raises(RuntimeError, match=r"bias must be \(3,\)"):
        linear_act(x, w, torch.randn(4, device="accel"))
    with pytest.raises(RuntimeError, match="weight has dtype BFloat16 but x has Float"):
        linear_act(x, w.bfloat16())
    code = "import torch_accel.ops as o; print(o.get_linear_kernel())"
    env = {**__import__("os").environ, "ACCEL_LINEAR_KERNEL": "fused"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "fused", run.stderr
    env["ACCEL_LINEAR_KERNEL"] = "quick"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "ACCEL_LINEAR_KERNEL='quick' is not one of auto, fused, aten" in run.stderr


def test_linear_act_autocast_and_opcheck():
    from torch_accel.ops import linear_act

    torch.manual_seed(12)
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    with torch.autocast("accel", dtype=torch.bfloat16):
        out = linear_act(*on("accel", x, w, b), "gelu")
    assert out.dtype == torch.bfloat16  # a linear layer: autocast's lower precision
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(out.cpu().float(), expected, atol=0.1, rtol=0.02)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    for device in ("cpu", "accel"):
        args = (*on(device, x, w, b, grad=True), "silu")
        for op in (torch.ops.accel.linear_act, torch.ops.accel.linear_act_forward):
            more = ("test_autograd_registration",) if device == "cpu" else ()
            torch.library.opcheck(op, args, test_utils=utils + more)


# --- flash_attention ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "causal", "dtype"),
    [
        ((2, 4, 33, 64), False, torch.float32),
        ((1, 8, 17, 128), True, torch.float32),
        ((2, 8, 40, 64), True, torch.bfloat16),
        ((1, 4, 9, 128), False, torch.float16),
    ],
    ids=str,
)
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_flash_attention_values_and_gradients(shape, causal, dtype, kv_heads):  # type: ignore[no-untyped-def]
    from torch_accel.ops import flash_attention

    torch.manual_seed(13)
    b, h, s, d = shape
    hk = kv_heads or h
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    g = torch.randn(b, h, s, d)
    cpu = on("cpu", q, k, v, grad=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *cpu, is_causal=causal, scale=0.3, enable_gqa=hk != h
    )
    expected.backward(g)
    acc = [t.detach().to("accel", dtype).requires_grad_() for t in (q, k, v)]
    out, lse = flash_attention(*acc, causal=causal, scale=0.3)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (b, h, s)
    out.backward(g.to("accel", dtype))
    tol = TOL[dtype] if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(out.cpu().float(), expected.detach(), **tol)
    scores = (q @ k.repeat_interleave(h // hk, 1).transpose(-1, -2)) * 0.3
    if causal:
        scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
    torch.testing.assert_close(lse.cpu(), scores.logsumexp(-1), **tol)
    gtol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    for a, e in zip(acc, cpu, strict=True):
        assert a.grad.shape == e.grad.shape
        torch.testing.assert_close(a.grad.cpu().float(), e.grad, **gtol)


def test_flash_attention_memory_is_linear_in_seq():
    """Beyond inputs and outputs, the kernel allocates no (seq, seq) scores: at seq 4096 they
    would be 64 MiB per head."""
    from torch_accel.ops import flash_attention

    q = torch.randn(1, 2, 4096, 64, device="accel")
    k, v = torch.randn_like(q), torch.randn_like(q)
    torch.accel.synchronize()
    torch.accel.reset_peak_memory_stats()
    before = torch.accel.memory_allocated()
    out, lse = flash_attention(q, k, v, causal=True)
    torch.accel.synchronize()
    extra = torch.accel.max_memory_allocated() - before - out.nbytes - lse.nbytes
    assert extra < 8 << 20, f"{extra} bytes beyond the outputs"


def test_flash_attention_autocasts_as_sdpa():
    from torch_accel.ops import flash_attention

    torch.manual_seed(15)
    q, k, v = (torch.randn(1, 2, 16, 32) for _ in range(3))
    with torch.autocast("accel", dtype=torch.bfloat16):
        out, lse = flash_attention(*(t.to("accel") for t in (q, k, v)), causal=True)
        sdpa = torch.nn.functional.scaled_dot_product_attention(
            *(t.to("accel") for t in (q, k, v)), is_causal=True
        )
    assert out.dtype == sdpa.dtype == torch.bfloat16 and lse.dtype == torch.float32
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out.cpu().float(), expected, atol=3e-2, rtol=3e-2)


def test_flash_attention_errors_and_opcheck():
    from torch_accel.ops import flash_attention

    def a(*sizes: int) -> torch.Tensor:
        return torch.randn(*sizes, device="accel")

    with pytest.raises(RuntimeError, match=r"the kv heads \(3\) must divide the q heads \(4\)"):
        flash_attention(a(1, 4, 8, 16), a(1, 3, 8, 16), a(1, 3, 8, 16))
    with pytest.raises(RuntimeError, match=r"must be \(batch, heads, seq, head_dim\)"):
        flash_attention(a(4, 8, 16), a(4, 8, 16), a(4, 8, 16))
    with pytest.raises(RuntimeError, match="k has dtype BFloat16 but q has Float"):
        flash_attention(a(1, 2, 8, 16), a(1, 2, 8, 16).bfloat16(), a(1, 2, 8, 16))
    with pytest.raises(NotImplementedError, match="Double is not supported"):
        flash_attention(*(a(1, 2, 8, 16).double() for _ in range(3)))
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    for device in ("cpu", "accel"):
        args = [torch.randn(1, 4, 8, 16, device=device, requires_grad=True) for _ in range(3)]
        more = ("test_autograd_registration",) if device == "cpu" else ()
        torch.library.opcheck(
            torch.ops.accel.flash_attention, (*args, True), test_utils=utils + more
        )


def test_sdpa_on_accel_runs_the_flash_kernel():
    """F.scaled_dot_product_attention on accel without dropout or mask takes the flash kernel
    (the one accel::flash_attention runs on the host), not the math path: asking for flash alone
    works, and the result matches flash_attention exactly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch_accel.ops import flash_attention

    torch.manual_seed(14)
    q, k, v = (torch.randn(2, 4, 32, 64, device="accel") for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, flash_attention(q, k, v, causal=True)[0], rtol=0, atol=0)
