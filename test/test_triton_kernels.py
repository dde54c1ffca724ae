"""accel's Triton kernels (torch_accel/kernels: the fused operators on the cuda driver) checked
on CPU tensors through Triton's interpreter, against the host kernels and PyTorch's attention.

The interpreter has to be chosen before triton is imported, so the tests run in a process of
their own, started by the first test with TRITON_INTERPRET=1 (see triton_interpreter.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton_interpreter  # test/

import torch_accel  # noqa: F401

pytest.importorskip("triton")
inside = pytest.mark.skipif(
    not triton_interpreter.active(), reason="runs in the interpreter's process (first test)"
)


@pytest.mark.config_independent  # CPU tensors only
@pytest.mark.skipif(triton_interpreter.active(), reason="this is the interpreter's process")
def test_the_kernels_in_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        cwd=Path(__file__).parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    # Everything ran there but this launcher.
    assert run.stdout.splitlines()[-1].split(" in ")[0].endswith("passed, 1 skipped"), run.stdout


if triton_interpreter.active():
    triton_interpreter.install_shim()
    from torch_accel.kernels import attention, rope


@inside
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cos_batch", [None, 1, 2])
def test_rope_kernels_match_the_host_kernels(interleaved, cos_batch):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    n, s, h, d = 2, 5, 3, 16
    x, w, g = torch.randn(n, s, h, d), torch.randn(d), torch.randn(n, s, h, d)
    table = (s, d) if cos_batch is None else (cos_batch, s, d)
    cos, sin = torch.randn(table), torch.randn(table)
    expected = torch.ops.accel.rms_norm_rope(x, w, cos, sin, 1e-5, interleaved)
    gx_expected, gw_expected = torch.ops.accel.rms_norm_rope_backward(
        g, x, w, cos, sin, 1e-5, interleaved
    )
    out, heads_first, gx = torch.empty_like(x), torch.empty(n, h, s, d), torch.empty_like(x)
    rope.rms_norm_rope_forward(x, w, cos, sin, 1e-5, interleaved, out)
    rope.rms_norm_rope_forward(x, w, cos, sin, 1e-5, interleaved, heads_first, True)
    gw = rope.rms_norm_rope_backward(g, x, w, cos, sin, 1e-5, interleaved, gx)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(heads_first.transpose(1, 2), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, gx_expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gw, gw_expected, atol=1e-5, rtol=1e-5)


@inside
def test_rope_kernels_refuse_head_dims_they_do_not_take():
    x = torch.randn(1, 2, 1, 12)
    with pytest.raises(NotImplementedError, match="twice a power of two, got 12"):
        rope.rms_norm_rope_forward(x, torch.ones(12), x[0, :, 0], x[0, :, 0], 1e-6, False, x)


@inside
@pytest.mark.parametrize(
    ("b", "h", "hk", "s", "d", "causal"),
    [(1, 2, 2, 40, 16, False), (2, 4, 2, 70, 32, True), (1, 2, 1, 33, 64, True)],
)
def test_flash_attention_kernels_match_sdpa(b, h, hk, s, d, causal):  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    q = torch.randn(b, h, s, d, requires_grad=True)
    k = torch.randn(b, hk, s, d, requires_grad=True)
    v = torch.randn(b, hk, s, d, requires_grad=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, enable_gqa=h != hk, scale=0.3
    )
    g = torch.randn_like(expected)
    expected.backward(g)
    _, lse_expected = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.detach(), k.detach(), v.detach(), 0.0, causal, scale=0.3
    )
    out, lse = torch.empty(b, h, s, d), torch.empty(b, h, s)
    with torch.no_grad():
        attention.forward(q, k, v, causal, 0.3, out, lse)
        dq, dk, dv = attention.backward(g, q, k, v, out, lse, causal, 0.3)
    torch.testing.assert_close(out, expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_expected, atol=1e-5, rtol=1e-5)
    for got, t in ((dq, q), (dk, k), (dv, v)):
        assert got.shape == t.shape
        torch.testing.assert_close(got, t.grad, atol=2e-5, rtol=2e-5)
