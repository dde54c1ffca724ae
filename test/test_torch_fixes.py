"""torch_accel/_torch_fixes.py: what torch_accel fixes in torch 2.11 where no extension point
reaches, each with a test that fails once the installed torch no longer needs the fix."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.dlpack import DLDeviceType

import torch_accel
from torch_accel import _torch_fixes


def test_torch_still_refuses_the_dlpack_device_of_renamed_backends() -> None:
    # Fails once torch tells renamed PrivateUse1 tensors apart itself (pytorch/pytorch#195815):
    # then remove the fix from _torch_fixes.py, and this test.
    t = torch.zeros(2, device="accel")
    try:
        _torch_fixes._original_dlpack_device(t)
    except ValueError as e:
        assert "Unknown device type accel for Dlpack" in str(e)
    else:
        raise AssertionError("torch's __dlpack_device__ takes accel tensors now: drop the fix")


def test_from_dlpack_shares_accel_memory_on_every_device() -> None:
    for index in range(min(2, torch_accel.device_count())):
        x = torch.arange(12.0, device=f"accel:{index}").view(3, 4)[:, 1:]  # strided view
        assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, index)
        y = torch.from_dlpack(x)
        assert y.device == x.device
        assert y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
        y.add_(1)  # one memory
        torch.testing.assert_close(x.cpu(), torch.arange(12.0).view(3, 4)[:, 1:] + 1)


def test_dlpack_of_parameters_capsules_and_other_devices_is_unchanged() -> None:
    p = torch.nn.Parameter(torch.ones(3, device="accel"))
    assert p.__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.from_dlpack(p.detach()).device.type == "accel"
    capsule = torch.utils.dlpack.to_dlpack(torch.full((2,), 7.0, device="accel"))
    assert torch.from_dlpack(capsule).cpu().tolist() == [7.0, 7.0]
    assert torch.zeros(1).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)
    assert torch.Tensor.__dlpack_device__.__name__ == "__dlpack_device__"


def _flex_inputs(device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(
        torch.randn(2, 3, 40, 8, dtype=torch.float64, generator=g).to(device).requires_grad_()
        for _ in range(3)
    )


def test_torch_still_refuses_flex_attention_on_renamed_backends() -> None:
    # Fails once torch's flex_attention takes PrivateUse1 inputs itself: then remove the fix
    # from _torch_fixes.py, and this test.
    q, k, v = _flex_inputs("accel")
    try:
        _torch_fixes._original_validate_device(q, k, v)
    except ValueError as e:
        assert "Found input tensors on accel device" in str(e)
    else:
        raise AssertionError("torch's flex_attention takes accel tensors now: drop the fix")


def test_flex_attention_runs_on_accel_forward_and_backward(fallback_mode) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fallback_mode("error")

    def bias(score: torch.Tensor, b: int, h: int, qi: torch.Tensor, ki: torch.Tensor):
        return score + 0.1 * (qi - ki) * (h + 1)

    def causal(b: int, h: int, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return qi >= ki

    q, k, v = _flex_inputs("accel")
    mask = create_block_mask(causal, None, None, 40, 40, device="accel")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unfused without torch.compile
        out = flex_attention(q, k, v, score_mod=bias, block_mask=mask)
    # The same attention written out on the CPU
    rq, rk, rv = _flex_inputs("cpu")
    pos = torch.arange(40)
    heads = torch.arange(1, 4).view(3, 1, 1)
    scores = rq @ rk.mT / 8**0.5 + 0.1 * (pos.view(-1, 1) - pos.view(1, -1)) * heads
    scores = scores.masked_fill(pos.view(-1, 1) < pos.view(1, -1), float("-inf"))
    expected = scores.softmax(-1) @ rv
    assert out.device.type == "accel"
    torch.testing.assert_close(out.detach().cpu(), expected.detach())
    w = torch.randn(expected.shape, dtype=torch.float64)
    (out * w.to("accel")).sum().backward()
    (expected * w).sum().backward()
    for got, want in ((q, rq), (k, rk), (v, rv)):
        torch.testing.assert_close(got.grad.cpu(), want.grad)
    assert torch.accel.fallback_stats() == {}
    # Other devices get torch's own check: the CPU still refuses backward
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(rq, rk, rv)


def test_compiled_flex_attention_on_accel_runs_eagerly_or_says_why() -> None:
    # Inductor would lower it with its GPU (Triton) template; the fix raises while Dynamo traces
    # it, so torch.compile runs flex_attention eagerly (a graph break), and fullgraph=True names
    # the reason.
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (t.detach() for t in _flex_inputs("accel"))
    expected = torch.nn.functional.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu())
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = torch.compile(flex_attention)(q, k, v)
        torch.testing.assert_close(got.cpu(), expected)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="flex_attention under torch.compile is not supported"):
            torch.compile(flex_attention, fullgraph=True)(q, k, v)
    torch._dynamo.reset()
