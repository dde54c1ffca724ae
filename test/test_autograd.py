"""Autograd on accel: gradients and a small MLP trained like on the CPU."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 4),
    )  # fmt: skip


def _train(device: str, optimizer: str, steps: int = 15) -> tuple[list[float], torch.nn.Module]:
    torch.manual_seed(1)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    model = _mlp().to(device)
    params = model.parameters()
    opt = (torch.optim.SGD(params, lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.AdamW(params, lr=1e-2))  # fmt: skip
    x, y = x.to(device), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def test_mlp_trains_with_the_same_losses_as_on_cpu():
    for optimizer in ("sgd", "adamw"):
        cpu_losses, cpu_model = _train("cpu", optimizer)
        accel_losses, accel_model = _train("accel", optimizer)
        assert accel_losses == cpu_losses, optimizer  # same kernels, same order: bit-exact
        assert cpu_losses[-1] < cpu_losses[0]
        for p_cpu, p_acc in zip(cpu_model.parameters(), accel_model.parameters(), strict=True):
            assert p_acc.device.type == "accel"
            assert_same(p_acc.detach(), p_cpu.detach())


def test_gradients_match_cpu_on_the_second_device():
    torch.manual_seed(2)
    a, b = torch.randn(5, 3), torch.randn(3, 4)
    ga, gb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ((ga @ gb).sin().sum()).backward()
    aa = a.to("accel:1").requires_grad_()
    ab = b.to("accel:1").requires_grad_()
    out = (aa @ ab).sin().sum()
    out.backward()
    assert aa.grad.device == torch.device("accel:1")
    assert_same(aa.grad, ga.grad)
    assert_same(ab.grad, gb.grad)


def test_views_and_in_place_ops_under_autograd():
    w = torch.randn(4, 4)
    wa = w.to("accel").requires_grad_()
    y = wa * 2
    y[:, 1].mul_(3)
    y.unfold(0, 2, 1).sum().backward()
    wc = w.clone().requires_grad_()
    yc = wc * 2
    yc[:, 1].mul_(3)
    yc.unfold(0, 2, 1).sum().backward()
    assert_same(wa.grad, wc.grad)


def _hessian_vector_product(device: str) -> torch.Tensor:
    """Forward-over-reverse: the tangent of the gradient of sum(|x| * x) along v, with x
    transposed (not contiguous)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64).t().to(device)
    v = torch.randn(3, 4, dtype=torch.float64).to(device)
    return torch.func.jvp(torch.func.grad(lambda t: (t.abs() * t).sum()), (x,), (v,))[1]


def test_forward_over_backward_matches_cpu():
    # abs's backward calls sgn, whose tangent is an efficient zero tensor (no memory); forward AD
    # copies it into a tangent laid out like the primal. That copy_ read a null pointer on accel
    # (a segfault for a strided tangent: test_ops_fwd_gradients.py's linalg.eigh).
    assert_same(_hessian_vector_product("accel"), _hessian_vector_product("cpu"))


def test_efficient_zero_tensors_behave_as_on_cpu():
    # ATen's ZeroTensor fallback materializes zero tensors except for a few operators it lets
    # through to the device's kernel: copy_ (into and from them), dot, vdot, views.
    def results(device: str) -> list[torch.Tensor]:
        z = torch._efficientzerotensor(2, 3, dtype=torch.float64, device=device)
        row = torch._efficientzerotensor(3, dtype=torch.float64, device=device)
        v = torch.arange(3.0, dtype=torch.float64, device=device)
        ones = lambda *shape: torch.ones(*shape, dtype=torch.float64, device=device)  # noqa: E731
        return [
            ones(2, 3).copy_(z),
            ones(3, 2).t().copy_(z),  # strided destination
            ones(2, 3).copy_(row),  # broadcast
            ones(2, 3).copy_(z.t().t()[:, :]),
            torch.ones(2, 3, dtype=torch.float64).copy_(z).to(device),  # into the CPU
            ones(2, 3).copy_(torch._efficientzerotensor(2, 3, dtype=torch.float64)),  # from it
            torch.dot(row, v),
            torch.vdot(v, row),
            z.t()[1] * 2.0,
        ]

    for actual, expected in zip(results("accel"), results("cpu"), strict=True):
        assert_same(actual, expected)
    z = torch._efficientzerotensor(2, 3, device="accel")
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        z.copy_(torch.ones(2, 3, device="accel"))
    assert torch.ones(2, device="accel").add(1).cpu().tolist() == [2.0, 2.0]
