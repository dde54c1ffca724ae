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


def test_custom_fwd_and_bwd_of_torch_accel_amp_act_as_torch_cudas() -> None:
    # torch.cuda.amp.custom_fwd/custom_bwd, deprecated there in favour of torch.amp's with a
    # device_type: the forward runs with autocast off and float32 inputs (cast_inputs), the
    # backward under the forward's autocast state.
    seen: dict[str, object] = {}

    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        seen["forward"] = (x.dtype, torch.is_autocast_enabled("accel"))
        ctx.save_for_backward(x)
        return x @ x

    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        seen["backward"] = torch.is_autocast_enabled("accel")
        (x,) = ctx.saved_tensors
        return grad @ x.T + x.T @ grad

    with pytest.warns(FutureWarning, match="device_type='accel'"):
        forward = torch.accel.amp.custom_fwd(cast_inputs=torch.float32)(forward)
    with pytest.warns(FutureWarning, match="device_type='accel'"):
        backward = torch.accel.amp.custom_bwd(backward)
    Square = type(
        "Square",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )

    x = torch.randn(4, 4, device="accel", dtype=torch.float16, requires_grad=True)
    with torch.autocast("accel", dtype=torch.float16):
        y = Square.apply(x)
        (other := x @ x).sum()
    assert y.dtype == torch.float32 and other.dtype == torch.float16
    assert seen["forward"] == (torch.float32, False)
    y.sum().backward()
    assert seen["backward"] is False  # as its forward ran: autocast off
    xf = x.detach().float().cpu()
    ones = torch.ones(4, 4)
    assert_same(x.grad, (ones @ xf.T + xf.T @ ones).half())


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


def test_torchvision_operators_follow_cudas_autocast_rules() -> None:
    # torchvision's autocast kernels for CUDA run its operators in float32 and cast the result
    # back to the input's dtype; accel registers the same (torch_accel/accel/amp_torchvision.py).
    # Without them, roi_align raised a dtype mismatch and nms "not implemented for 'BFloat16'".
    ops = pytest.importorskip("torchvision.ops")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 16, 16, generator=g).bfloat16()
    boxes = torch.tensor(
        [[0, 1.0, 1.0, 9.0, 8.0], [1, 2.5, 3.0, 14.0, 12.0], [0, 0.0, 0.0, 15, 15]]
    )
    weight = torch.randn(4, 8, 3, 3, generator=g)
    offset = torch.randn(2, 18, 14, 14, generator=g).bfloat16()
    calls = {
        "roi_align": lambda t, b: ops.roi_align(t, b, 4, 0.5, 2, True),
        "roi_pool": lambda t, b: ops.roi_pool(t, b, 4, 0.5),
        "ps_roi_align": lambda t, b: ops.ps_roi_align(t, b, 2, 0.5, 2),
        "ps_roi_pool": lambda t, b: ops.ps_roi_pool(t, b, 2, 0.5),
    }
    for name, call in calls.items():
        expected = call(x.float(), boxes).bfloat16()  # float32 on the CPU, then the input's dtype
        with torch.autocast("accel", dtype=torch.bfloat16):
            got = call(x.to("accel"), boxes.to("accel"))
        assert got.dtype == torch.bfloat16, name
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, msg=name)
    scores = torch.rand(3, generator=g).bfloat16()
    with torch.autocast("accel", dtype=torch.bfloat16):
        kept = ops.nms(boxes[:, 1:].bfloat16().to("accel"), scores.to("accel"), 0.3)
        conv = ops.deform_conv2d(x.to("accel"), offset.to("accel"), weight.to("accel"))
    assert kept.tolist() == ops.nms(boxes[:, 1:].bfloat16().float(), scores.float(), 0.3).tolist()
    assert conv.dtype == torch.bfloat16
    torch.testing.assert_close(
        conv.cpu(), ops.deform_conv2d(x.float(), offset.float(), weight).bfloat16(), rtol=0, atol=0
    )


# The debug modes run test_third_party.py's Faster R-CNN (the same operators, without autocast,
# whose rules the debug modes do not change): 20 s less in each.
@pytest.mark.default_only
def test_faster_rcnn_infers_under_accel_autocast() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(
        weights=None, weights_backbone=None, num_classes=5
    ).eval()
    images = [torch.rand(3, 96, 128)]
    acc = model.to("accel")
    with torch.no_grad(), torch.autocast("accel", dtype=torch.bfloat16):
        (detections,) = acc([i.to("accel") for i in images])
    # Before torchvision's operators had accel's autocast rules this raised "dets should have the
    # same type as scores" (nms of float32 boxes against autocast's bfloat16 scores).
    assert set(detections) == {"boxes", "labels", "scores"}
    assert detections["boxes"].device.type == "accel" and detections["boxes"].shape[1] == 4
    assert len(detections["boxes"]) == len(detections["scores"]) > 0
    assert torch.isfinite(detections["boxes"].float()).all()


def test_torchvision_autocast_rules_whichever_is_imported_first(run_python) -> None:
    # torchvision imported before torch: torch_accel (autoloaded by torch) registers once
    # torchvision's operators exist (after torchvision.ops is imported).
    pytest.importorskip("torchvision")
    code = (
        "import torchvision, torch\n"
        "x = torch.randn(1, 4, 8, 8, device='accel').bfloat16()\n"
        "b = torch.tensor([[0, 1.0, 1.0, 6.0, 6.0]], device='accel')\n"
        "with torch.autocast('accel', dtype=torch.bfloat16):\n"
        "    print(torchvision.ops.roi_align(x, b, 2).dtype)\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "torch.bfloat16"
