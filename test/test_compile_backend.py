"""torch.compile(backend="accel"): compiled graphs captured into AccelGraphs and replayed.

Values against eager (the CPU, or the same function uncompiled); the backend's counters say
what was captured, replayed, or moved out of a graph's outputs before a replay overwrote them.
"""

from __future__ import annotations

import pytest
import torch

import helpers
import torch_accel  # noqa: F401
from helpers import compiled_mlp_trains_like_the_cpu as _train_against_cpu
from helpers import small_mlp as _mlp

ACCEL = torch.device("accel")
# In Triton's interpreter a capture refuses the kernels (their arguments go through pageable host
# memory), so the backend runs the graphs uncaptured, as it does for any graph it cannot capture.
INTERPRETED = "Triton's interpreter kernels cannot be captured: the backend never replays"


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@helpers.skip_in_triton_interpreter(INTERPRETED)
def test_the_accel_backend_captures_replays_and_trains_like_eager() -> None:
    from torch_accel._dynamo import backend

    before = dict(backend.stats)
    compiled: list[torch.nn.Module] = []

    def compile_accel(m: torch.nn.Module) -> torch.nn.Module:
        compiled.append(torch.compile(m, backend="accel"))
        return compiled[0]

    model, reference = _train_against_cpu(compile_accel, steps=5)
    assert backend.stats["captures"] - before["captures"] == 2  # forward and backward
    assert backend.stats["replays"] - before["replays"] >= 6
    # Parameters moved elsewhere: captured again, with their new memory.
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.clone()
    x = torch.randn(8, 16)
    torch.testing.assert_close(
        compiled[0](x.to(ACCEL)).cpu(), reference(x).detach(), atol=1e-5, rtol=1e-5
    )


@helpers.skip_in_triton_interpreter(INTERPRETED)
def test_the_accel_backend_keeps_held_outputs_when_it_replays() -> None:
    from torch_accel._dynamo import backend

    f = torch.compile(lambda t: t * 2 + 1, backend="accel")
    xs = [torch.full((64,), float(i), device=ACCEL) for i in range(6)]
    before = dict(backend.stats)
    kept = [f(x) for x in xs[:3]]  # each still held when the next call replays
    view = f(xs[3]).view(8, 8)[1:]  # only a view of the output is held
    rest = [f(x) for x in xs[4:]]
    for i, out in enumerate([*kept, None, *rest]):
        if out is not None:
            torch.testing.assert_close(out.cpu(), torch.full((64,), 2.0 * i + 1))
    torch.testing.assert_close(view.cpu(), torch.full((7, 8), 7.0))
    assert backend.stats["replays"] - before["replays"] == 5  # the first call ran uncaptured
    assert backend.stats["moved_outputs"] - before["moved_outputs"] >= 4
    # Nothing held any more: the next replays move nothing.
    del kept, view, rest, out
    moved = backend.stats["moved_outputs"]
    for x in xs:
        assert f(x).sum().item() == 64 * (2 * x[0].item() + 1)
    assert backend.stats["moved_outputs"] == moved


def test_the_accel_backend_writes_inputs_the_graph_mutates() -> None:
    def double(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x.sum()

    from torch_accel._dynamo import backend

    before = dict(backend.stats)
    f = torch.compile(double, backend="accel")
    for i in range(4):  # new tensors each call: copied into the graph's inputs and back
        x = torch.full((8,), float(i), device=ACCEL)
        assert f(x).item() == 16 * i
        torch.testing.assert_close(x.cpu(), torch.full((8,), 2.0 * i))
    # A compiled AdamW step (capturable: its step counts live on accel) updates parameters
    # and state in place, as the eager one does.
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64)) for _ in range(3)]
    mine = [torch.nn.Parameter(p.detach().to(ACCEL)) for p in params]
    ref_opt = torch.optim.AdamW(params, lr=0.1)
    opt = torch.optim.AdamW(mine, lr=0.1, foreach=True, capturable=True)
    step = torch.compile(opt.step, backend="accel")
    for k in range(4):
        for p, q in zip(params, mine, strict=True):
            p.grad = torch.randn(64, generator=torch.Generator().manual_seed(k))
            q.grad = p.grad.to(ACCEL)
        ref_opt.step()
        step()
        for p, q in zip(params, mine, strict=True):
            torch.testing.assert_close(q.detach().cpu(), p.detach(), atol=1e-5, rtol=1e-5)
    assert opt.state[mine[0]]["step"].item() == 4
    # New gradient tensors every step: copied into the graph, not a capture per step.
    assert backend.stats["captures"] - before["captures"] <= 2


@helpers.skip_in_triton_interpreter(INTERPRETED)
def test_the_accel_backend_accumulates_gradients_over_two_forwards() -> None:
    # The first forward's activations are still needed when the second replays: moved, not
    # overwritten. The backward graph reads the forward graph's outputs in place otherwise.
    from torch_accel._dynamo import backend

    torch.manual_seed(0)
    model, reference = _mlp(), _mlp()
    reference.load_state_dict(model.state_dict())
    model.to(ACCEL)
    compiled = torch.compile(model, backend="accel")
    before = dict(backend.stats)
    for step in range(4):
        xs = [
            torch.randn(8, 16, generator=torch.Generator().manual_seed(10 * step + k))
            for k in (0, 1)
        ]
        for m, dev in ((compiled, ACCEL), (reference, "cpu")):
            m.zero_grad()
            losses = [m(x.to(dev)).square().mean() for x in xs]
            sum(losses).backward()
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, atol=1e-5, rtol=1e-5)
    assert backend.stats["moved_outputs"] > before["moved_outputs"]
    assert backend.stats["replays"] - before["replays"] >= 8


@helpers.skip_in_triton_interpreter(INTERPRETED)
def test_the_accel_backend_reads_the_previous_graphs_outputs_in_place() -> None:
    from torch_accel._dynamo import backend

    def broken(t: torch.Tensor) -> torch.Tensor:
        u = (t * 3).sin()
        torch._dynamo.graph_break()
        return u.exp() + u

    f = torch.compile(broken, backend="accel")
    before = dict(backend.stats)
    for i in range(5):
        x = torch.randn(32, generator=torch.Generator().manual_seed(i))
        expected = broken(x)
        torch.testing.assert_close(f(x.to(ACCEL)).cpu(), expected)
    assert backend.stats["captures"] - before["captures"] == 2
    assert backend.stats["replays"] - before["replays"] == 8  # calls 2 to 5 of each graph
    assert backend.stats["uncaptured_calls"] == before["uncaptured_calls"]


def test_the_accel_backend_runs_dynamic_shapes_uncaptured(caplog) -> None:
    f = torch.compile(lambda t: (t.sin() * 2).sum(0), backend="accel")
    with caplog.at_level("WARNING", logger="torch_accel.compile"):
        for n in (5, 9, 12):
            t = torch.randn(n, 3, device=ACCEL)
            torch._dynamo.mark_dynamic(t, 0)
            torch.testing.assert_close(f(t).cpu(), (t.cpu().sin() * 2).sum(0))
    assert any("without graph capture" in r.getMessage() for r in caplog.records)


@helpers.skip_in_triton_interpreter(INTERPRETED)
def test_the_accel_backend_takes_torch_compiles_mode_and_options() -> None:
    # torch.compile passes mode= and options= to a backend other than Inductor as keyword
    # arguments (compile_fx rejected `options`): they configure Inductor as for
    # backend="inductor", here the C++ wrapper, whose kernels the backend captures and replays.
    from torch._inductor.utils import run_and_get_code

    from torch_accel._dynamo import backend

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.relu(t @ t.T) * 2 + 1

    xs = [torch.randn(8, 8, device=ACCEL) for _ in range(4)]
    f = torch.compile(fn, backend="accel", options={"cpp_wrapper": True})
    before = dict(backend.stats)
    outs, (code,) = run_and_get_code(lambda: [f(x) for x in xs])
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, fn(x))
    assert "torch_accel_aoti::launch(" in code
    assert backend.stats["replays"] - before["replays"] == 3
    torch._dynamo.reset()
    f = torch.compile(fn, backend="accel", mode="max-autotune-no-cudagraphs")
    for x in xs:
        torch.testing.assert_close(f(x), fn(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Unexpected optimization option no_such_option"):
        torch.compile(lambda t: t + 1, backend="accel", options={"no_such_option": 1})(xs[0])
