"""nn.Module on accel: parameters keep their identity across moves, as on CUDA.

torch moves a module's parameters in place (param.data = moved) when
torch._has_compatible_shallow_copy_type(param, moved) holds; accel implements that operator, so
tied weights stay tied, optimizers built before .to() keep training the module, and lazy
modules keep their uninitialized parameters.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

ACCEL = torch.device("accel")


class TiedLM(nn.Module):
    """A small causal LM whose output projection is its embedding (as GPT-2's lm_head)."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.block = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens)
        return self.lm_head(self.norm(h + self.block(h)))


def _loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


@pytest.mark.parametrize(
    "move",
    [
        lambda m: m.to("accel"),
        lambda m: m.accel(),
        lambda m: m.to(ACCEL, torch.float32),
        lambda m: m.to("accel").to("accel:1"),
        lambda m: m.to("accel").to("cpu"),
        lambda m: m.to("accel").cpu(),
    ],
    ids=["to", "accel", "to_dtype", "accel0_to_accel1", "back_to_cpu", "cpu"],
)
def test_moves_keep_parameter_and_buffer_objects(move) -> None:
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    m(torch.randn(5, 3)).sum().backward()
    before = {n: p for n, p in m.named_parameters()}
    grads = {n: p.grad for n, p in m.named_parameters()}
    expected = {n: p.detach().clone() for n, p in before.items()}
    assert move(m) is m
    for n, p in m.named_parameters():
        assert p is before[n], n
        assert p.grad is not None and p.grad.device == p.device, n
        assert p.grad is grads[n], n  # the gradient object moves in place too
        torch.testing.assert_close(p.detach().cpu(), expected[n])


def test_device_of_moves() -> None:
    m = nn.Linear(2, 2)
    w = m.weight
    m.to("accel:1")
    assert m.weight is w and w.device == torch.device("accel", 1)
    m.to("accel:0")
    assert m.weight is w and w.device == torch.device("accel", 0)


def test_tied_weights_stay_tied_and_train_like_cpu() -> None:
    torch.manual_seed(0)
    cpu = TiedLM()
    acc = copy.deepcopy(cpu).to("accel")
    assert acc.lm_head.weight is acc.wte.weight
    assert len(list(acc.parameters())) == len(list(cpu.parameters()))
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_acc = torch.optim.AdamW(acc.parameters(), lr=1e-2)
    tokens = torch.randint(0, 32, (4, 9), generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        for model, opt, t in ((cpu, opt_cpu, tokens), (acc, opt_acc, tokens.to(ACCEL))):
            opt.zero_grad()
            loss = _loss(model, t)
            loss.backward()
            model.last_loss = loss.item()
            model.last_grad = model.wte.weight.grad.detach().cpu()
            opt.step()
        assert acc.last_loss == pytest.approx(cpu.last_loss, rel=1e-5)
        torch.testing.assert_close(acc.last_grad, cpu.last_grad, rtol=1e-4, atol=1e-5)
    for p_cpu, p_acc in zip(cpu.parameters(), acc.parameters(), strict=True):
        torch.testing.assert_close(p_acc.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5)
    assert acc.lm_head.weight is acc.wte.weight


def test_optimizer_created_before_move_trains_the_module() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    m.to("accel")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(3):
        for model, o, xx, yy in ((ref, opt_ref, x, y), (m, opt, x.to(ACCEL), y.to(ACCEL))):
            o.zero_grad()
            nn.functional.mse_loss(model(xx), yy).backward()
            o.step()
    for p, q in zip(m.parameters(), ref.parameters(), strict=True):
        assert p.device.type == "accel"
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    # The optimizer's state lives on accel with the parameters it updates.
    for state in opt.state.values():
        assert state["momentum_buffer"].device.type == "accel"


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: nn.LazyConv2d(4, 3), (2, 3, 6, 6)),
        (lambda: nn.LazyLinear(5), (2, 7)),
        (lambda: nn.LazyBatchNorm1d(), (4, 3)),
    ],
    ids=["conv2d", "linear", "batchnorm1d"],
)
def test_lazy_modules_moved_before_first_forward(make, shape) -> None:
    torch.manual_seed(0)
    lazy = make()
    moved = make().to("accel")
    assert any(isinstance(p, nn.parameter.UninitializedParameter) for p in moved.parameters()), (
        "the move must keep the parameters uninitialized"
    )
    x = torch.randn(*shape)
    out = moved(x.to(ACCEL))
    expected = lazy(x)
    assert all(p.device.type == "accel" for p in moved.parameters())
    # Initialized from different random streams: compare with the CPU module's parameters.
    with torch.no_grad():
        for p, q in zip(lazy.parameters(), moved.parameters(), strict=True):
            q.copy_(p)
    torch.testing.assert_close(moved(x.to(ACCEL)).cpu(), lazy(x), rtol=1e-5, atol=1e-5)
    assert out.shape == expected.shape


class _Wrapper(torch.Tensor):
    """A wrapper subclass (as torchao's NF4Tensor) that handles a few operators, records each
    operator that reaches it, and refuses the others."""

    seen: list[str] = []

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> _Wrapper:
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=inner.device
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        cls.seen.append(str(func))
        aten = torch.ops.aten
        if func in (aten._to_copy.default, aten.detach.default):
            return _Wrapper(func(args[0].inner, *args[1:], **(kwargs or {})))
        raise NotImplementedError(f"{func} reached the subclass")


@pytest.mark.parametrize("device", ["cpu", "accel"])
def test_wrapper_subclass_parameters_move_as_on_the_cpu(device: str) -> None:
    """PyTorch answers _has_compatible_shallow_copy_type at the autograd key, above the Python
    key; accel's kernel was at its backend key alone, so the question reached a wrapper
    subclass's __torch_dispatch__ on accel, and Module.to("accel") of torchao's NF4 (QLoRA)
    parameters failed (found by a torchtune sweep)."""
    _Wrapper.seen = []
    w = _Wrapper(torch.zeros(3, device=device))
    assert torch._has_compatible_shallow_copy_type(w, w)
    assert _Wrapper.seen == []
    m = nn.Linear(3, 3)
    m.weight = nn.Parameter(_Wrapper(torch.ones(3, 3)), requires_grad=False)
    weight = m.weight
    m.to(device)
    assert m.weight is weight and m.weight.device.type == device
    assert "aten._has_compatible_shallow_copy_type.default" not in _Wrapper.seen


def test_shallow_copy_compatibility() -> None:
    cpu = torch.zeros(2)
    acc = torch.zeros(2, device="accel")
    assert torch._has_compatible_shallow_copy_type(cpu, acc)
    assert torch._has_compatible_shallow_copy_type(acc, cpu)
    assert torch._has_compatible_shallow_copy_type(acc, torch.zeros(3, device="accel:1"))
    assert not torch._has_compatible_shallow_copy_type(acc, cpu.to_sparse())
    p = nn.Parameter(torch.ones(2))
    p.data = acc
    assert p.device.type == "accel" and isinstance(p, nn.Parameter)
