"""torch.accel.set_sync_debug_mode, as torch.cuda's: operations that make the host wait for accel's
work warn or raise; steady-state training does not. Values are compared with the CPU's."""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import torch_accel

ACCEL = torch.device("accel")
PHRASE = "called a synchronizing accel operation"


@pytest.fixture(autouse=True)
def _restore_mode() -> Iterator[None]:
    before = torch.accel.get_sync_debug_mode()
    yield
    torch.accel.set_sync_debug_mode(before)


def _sync_warnings(fn: Callable[[], object]) -> tuple[object, list[str]]:
    """fn's result and the sync warnings it raised, in warn mode."""
    torch.accel.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    torch.accel.set_sync_debug_mode("default")
    return result, [str(w.message) for w in caught if PHRASE in str(w.message)]


def test_modes_by_name_and_number_and_bad_values() -> None:
    assert torch.accel.get_sync_debug_mode() == 0
    for name, number in [("warn", 1), ("error", 2), ("default", 0), (2, 2), (1, 1), (0, 0)]:
        torch.accel.set_sync_debug_mode(name)
        assert torch.accel.get_sync_debug_mode() == number
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
        torch.accel.set_sync_debug_mode("loud")
    with pytest.raises(ValueError, match="expected one of 0 .default., 1 .warn., 2 .error."):
        torch.accel.set_sync_debug_mode(3)
    with pytest.raises(TypeError, match="int or a str"):
        torch.accel.set_sync_debug_mode(True)
    assert torch.accel.get_sync_debug_mode() == 0


# Each: what the call waits for (the operator named in the warning), and the call on a CPU or
# accel tensor.
WAITING = {
    "nonzero": ("aten::nonzero", "result shape depends on the data", lambda x: x.nonzero()),
    "boolean_mask": ("aten::index.Tensor", "depends on the data", lambda x: x[x > 0]),
    "item": ("Tensor.item()", "reads a value on the host", lambda x: x.sum().item()),
    "bool": ("Tensor.item()", "", lambda x: bool((x > 0).any())),
    "tolist": ("copy_ (accel to host)", "blocking copy", lambda x: x.tolist()),
    "to_cpu": ("copy_ (accel to host)", "blocking copy", lambda x: x.cpu()),
    "equal": ("aten::equal", "returns a value to the host", lambda x: torch.equal(x, x + 0)),
}


@pytest.mark.parametrize("case", WAITING)
def test_waiting_operations_warn_and_still_compute(case: str) -> None:
    named, why, fn = WAITING[case]
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    a = x.to(ACCEL)
    fn(a)  # the first call of each signature is accel's warm-up
    result, found = _sync_warnings(lambda: fn(a))
    assert found, f"{case}: no sync warning"
    assert any(named in w and why in w for w in found), found
    expected = fn(x)
    if isinstance(result, torch.Tensor):
        torch.testing.assert_close(result.cpu(), expected)
    else:
        assert result == expected


def test_upload_warns_unless_non_blocking_from_pinned_memory() -> None:
    x = torch.arange(6.0)
    _, found = _sync_warnings(lambda: x.to(ACCEL))
    assert any("copy_ (host to accel)" in w for w in found), found
    _, found = _sync_warnings(lambda: torch.tensor([1.0, 2.0], device=ACCEL))
    assert found
    pinned = x.pin_memory()
    a, found = _sync_warnings(lambda: pinned.to(ACCEL, non_blocking=True))
    assert found == []
    torch.testing.assert_close(a.cpu(), x)


def test_error_mode_raises_before_the_operation_runs() -> None:
    a = torch.tensor([0.0, 3.0, 0.0, 5.0], device=ACCEL)
    out = torch.full((2, 1), -1, dtype=torch.long, device=ACCEL)
    torch.nonzero(a, out=torch.empty(0, 1, dtype=torch.long, device=ACCEL))  # warm-up
    torch.accel.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match=f"{PHRASE}: aten::nonzero.out waits .*'error'"):
        torch.nonzero(a, out=out)
    with pytest.raises(RuntimeError, match=f"{PHRASE}: Tensor.item()"):
        a.sum().item()
    with pytest.raises(RuntimeError, match=PHRASE):
        a.cpu()
    torch.accel.set_sync_debug_mode("default")
    # The out= tensor was not resized or written, and the device works on.
    assert out.shape == (2, 1) and (out.cpu() == -1).all()
    assert torch.nonzero(a, out=out).cpu().flatten().tolist() == [1, 3]
    assert (a * 2).sum().item() == 16.0


def test_explicit_waits_do_not_report() -> None:
    a = torch.randn(64, 64, device=ACCEL)
    stream = torch.accel.Stream()
    event = torch.accel.Event()
    torch.accel.set_sync_debug_mode("error")
    b = a @ a
    event.record()
    event.synchronize()
    stream.synchronize()
    torch.accel.current_stream().synchronize()
    torch.accel.synchronize()
    torch.accel.set_sync_debug_mode("default")
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-4)


# The fused SGD and Adagrad steps have no Meta kernel in torch, nor fused Adam's with a tensor
# learning rate: they waited on every step until accel knew that in-place operators returning
# nothing need none.
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "sgd_fused": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True),
    "adagrad_fused": lambda params: torch.optim.Adagrad(params, lr=1e-2, fused=True),
    "adam_fused_tensor_lr": lambda params: torch.optim.Adam(
        params, lr=torch.tensor(1e-2), fused=True
    ),
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_training_step_does_not_wait_once_warm(optimizer: str) -> None:
    """What users turn "error" on for: a step whose only waits are the ones they ask for."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 2))
    model = copy.deepcopy(cpu).to(ACCEL)
    opts = [OPTIMIZERS[optimizer](m.parameters()) for m in (cpu, model)]
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)) for _ in range(3)
    ]
    inputs = [(x.to(ACCEL), y.to(ACCEL)) for x, y in batches]

    def step(m: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y).backward()
        opt.step()

    step(model, opts[1], *inputs[0])  # warm-up: accel learns each signature's result shapes
    torch.accel.set_sync_debug_mode("error")
    for x, y in inputs[1:]:
        step(model, opts[1], x, y)
    with pytest.raises(RuntimeError, match=PHRASE):
        model(inputs[0][0]).sum().item()
    torch.accel.set_sync_debug_mode("default")
    for x, y in batches:
        step(cpu, opts[0], x, y)
    for p, q in zip(cpu.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)


def test_the_cpu_fallback_reports_once_per_call() -> None:
    a = torch.randn(3, device=ACCEL)
    torch_accel._C._set_force_fallback(True)
    try:
        result, found = _sync_warnings(lambda: a * 3)
    finally:
        torch_accel._C._set_force_fallback(False)
    assert len(found) == 1 and "aten::mul.Tensor" in found[0] and "CPU fallback" in found[0]
    torch.testing.assert_close(result.cpu(), a.cpu() * 3)


def test_the_mode_is_process_wide() -> None:
    a = torch.randn(3, device=ACCEL)
    torch.accel.set_sync_debug_mode("error")
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            a.cpu()
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(errors) == 1 and PHRASE in str(errors[0])
