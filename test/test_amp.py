"""Mixed precision on accel: autocast with CUDA's op lists, torch.accel.amp, GradScaler."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import assert_same

LOW = (torch.bfloat16, torch.float16)


def test_amp_names() -> None:
    assert torch.accel.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.accel.amp.get_amp_supported_dtype is torch.accel.get_amp_supported_dtype
    assert torch.get_autocast_dtype("accel") == torch.float16  # CUDA's default
    with torch.accel.amp.autocast():
        assert torch.is_autocast_enabled("accel")
        assert torch.get_autocast_dtype("accel") == torch.float16
    with torch.accel.amp.autocast(dtype=torch.bfloat16):
        assert torch.get_autocast_dtype("accel") == torch.bfloat16
    assert not torch.is_autocast_enabled("accel")


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_ops_follow_cudas_list(dtype: torch.dtype) -> None:
    a = torch.randn(4, 8, device="accel")
    w = torch.randn(8, 8, device="accel")
    img = torch.randn(1, 2, 6, 6, device="accel")
    k = torch.randn(3, 2, 3, 3, device="accel")
    q = torch.randn(1, 2, 4, 8, device="accel")
    with torch.autocast("accel", dtype=dtype):
        lowered = {
            "mm": a @ w,
            "linear": F.linear(a, w),
            "addmm": torch.addmm(a, a, w),
            "bmm": torch.bmm(a[None], w[None]),
            "conv2d": F.conv2d(img, k),
            "sdpa": F.scaled_dot_product_attention(q, q, q),
        }
        fp32 = {
            "softmax": torch.softmax(a.to(dtype), 1),
            "log_softmax": F.log_softmax(a.to(dtype), 1),
            "layer_norm": F.layer_norm(a.to(dtype), (8,)),
            "exp": torch.exp(a.to(dtype)),
            "sum": a.to(dtype).sum(),
            "mse_loss": F.mse_loss(a.to(dtype), a),
            "cross_entropy": F.cross_entropy(
                a.to(dtype), torch.zeros(4, dtype=torch.long, device="accel")
            ),
        }
        promoted = torch.cat([a.to(dtype), a])  # widest input type
        untouched = (a + a, torch.relu(a.to(dtype)))
    for name, t in lowered.items():
        assert t.dtype == dtype, name
        assert t.device.type == "accel"
    for name, t in fp32.items():
        assert t.dtype == torch.float32, name
    assert promoted.dtype == torch.float32
    assert untouched[0].dtype == torch.float32 and untouched[1].dtype == dtype
    # Values: the lowered product is the product of the rounded inputs.
    expected = (a.cpu().to(dtype) @ w.cpu().to(dtype)).float()
    torch.testing.assert_close(lowered["mm"].float().cpu(), expected, rtol=2e-2, atol=2e-2)


def test_binary_cross_entropy_is_refused_under_autocast() -> None:
    p = torch.rand(4, device="accel")
    with torch.autocast("accel", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, p)
        loss = F.binary_cross_entropy_with_logits(p, p)
    assert loss.dtype == torch.float32
    assert_same(loss, F.binary_cross_entropy_with_logits(p.cpu(), p.cpu()), exact=False)


def test_autocast_backward_gives_float32_gradients() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model.to("accel")
    x = torch.randn(5, 8, device="accel")
    with torch.autocast("accel", dtype=torch.bfloat16):
        out = model(x)
        loss = F.cross_entropy(out, torch.tensor([0, 1, 2, 3, 0], device="accel"))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32
        assert torch.isfinite(p.grad).all().item()


def test_grad_scaler_scales_unscales_and_skips_steps_with_infs() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("accel")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("accel", init_scale=1024.0, growth_interval=1)
    assert isinstance(torch.accel.amp.GradScaler(), torch.amp.GradScaler)
    x = torch.randn(3, 4, device="accel")

    with torch.autocast("accel", dtype=torch.float16):
        loss = model(x).float().square().mean()
    scaled = scaler.scale(loss)
    assert scaled.device.type == "accel"
    assert scaled.item() == pytest.approx(loss.item() * 1024.0, rel=1e-3)
    scaled.backward()
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.detach().clone() / 1024.0 for p in model.parameters()]
    scaler.step(opt)  # unscales, finds no inf, steps
    scaler.update()
    assert scaler.get_scale() == 2048.0  # grew after a good step (growth_interval=1)
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p.detach().cpu(), (b - 0.1 * g).cpu(), rtol=1e-4, atol=1e-5)

    # An inf gradient: the step is skipped and the scale backs off.
    opt.zero_grad()
    scaler.scale(model(x).float().sum()).backward()
    model.weight.grad[0, 0] = float("inf")
    kept = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0
    for p, k in zip(model.parameters(), kept, strict=True):
        assert torch.equal(p.detach().cpu(), k.cpu())


def test_amp_unscale_op_matches_cpu() -> None:
    grads = [torch.tensor([2.0, 4.0]), torch.tensor([float("nan"), 1.0])]
    for bad in (False, True):
        cpu = [g.clone() if bad else g.nan_to_num() for g in grads]
        acc = [g.to("accel") for g in cpu]
        found_cpu, found_acc = torch.zeros(1), torch.zeros(1, device="accel")
        torch._amp_foreach_non_finite_check_and_unscale_(cpu, found_cpu, torch.tensor(0.5))
        torch._amp_foreach_non_finite_check_and_unscale_(
            acc, found_acc, torch.tensor(0.5, device="accel")
        )
        assert_same(found_acc, found_cpu)
        for a, c in zip(acc, cpu, strict=True):
            assert_same(a, c)
