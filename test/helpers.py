"""Assertions shared by the accel test suites."""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch


def assert_same(actual: torch.Tensor, expected: torch.Tensor, exact: bool = True) -> None:
    """An accel result has the CPU reference's values, dtype and shape."""
    assert actual.device.type == "accel", actual.device
    if exact:
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def on(device: str, value: Any) -> Any:
    """`value` (a tensor, or a list or tuple of them and other values) on `device`, each tensor
    with its layout: views keep their strides and offset (their base is moved)."""
    if isinstance(value, torch.Tensor):
        base = value._base if value._base is not None else value
        moved = base.to(device)
        return moved.as_strided(value.size(), value.stride(), value.storage_offset())
    if isinstance(value, (list, tuple)):
        return type(value)(on(device, v) for v in value)
    return value


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def capture_while_another_thread_runs(
    mode: str, other: Callable[[], None]
) -> tuple[BaseException | None, BaseException | None, Callable[[], None]]:
    """Captures ``y = ones(3) * 2`` on accel in ``capture_error_mode=mode`` while another
    thread runs ``other``. Returns the error the capture raised (None if it did not), the error
    ``other`` raised (None if none), and a check that replays the graph and compares ``y``."""
    import torch_accel

    x = torch.ones(3, device="accel")
    thread_errors: list[BaseException] = []

    def run() -> None:
        try:
            other()
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            thread_errors.append(e)

    g = torch.accel.AccelGraph()  # type: ignore[attr-defined]
    capture_error = None
    try:
        with torch.accel.graph(g, capture_error_mode=mode):  # type: ignore[attr-defined]
            y = x * 2
            t = threading.Thread(target=run)
            t.start()
            t.join()
    except torch_accel.CaptureError as e:
        capture_error = e

    def replay_matches_eager() -> None:
        g.replay()
        torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))

    return capture_error, (thread_errors[0] if thread_errors else None), replay_matches_eager


LAUNCH_BLOCKING = os.environ.get("ACCEL_LAUNCH_BLOCKING", "") not in ("", "0")


def pending_behind_a_sleep(
    enqueue: Callable[[], None],
    query: Callable[[], bool],
    sleep_ns: int = 100_000_000,
    prepare: Callable[[], None] | None = None,
) -> tuple[bool, float]:
    """Holds the current accel stream busy for ``sleep_ns``, calls ``enqueue()`` and takes
    ``query()`` at once. Returns whether the work was pending then, and the ``time.monotonic()``
    until which the sleep surely holds the stream (it began after that clock was read). The answer
    means something only if the host needed less time than the sleep; on a loaded machine it may
    not (CI runs three lanes on two cores), so then the attempt is repeated behind a sleep twice as
    long (an ``enqueue()`` that waits for the stream never answers: AssertionError). ``prepare()``
    runs before each attempt's sleep (a test of a signature's first calls makes a new one there).
    Under ACCEL_LAUNCH_BLOCKING everything has run before ``query()``, as CUDA's."""
    for _ in range(5):
        if prepare is not None:
            prepare()
        torch.accel.synchronize()
        start = time.monotonic()
        torch.accel._sleep(sleep_ns)
        enqueue()
        done = query()
        busy_until = start + sleep_ns * 1e-9
        if LAUNCH_BLOCKING or time.monotonic() < busy_until:
            return not done, busy_until
        sleep_ns *= 2
    raise AssertionError(f"the host needed longer than each sleep, up to {sleep_ns // 2} ns")


def replay_keeps_freed_inputs(graph: Any, inputs: list[torch.Tensor], nbytes: int) -> None:
    """Frees `inputs` (the caller hands over its last references in the list, which is emptied),
    empties the cache and replays `graph`: the graph keeps the memory its work uses, so the
    segments stay reserved for the replay (on CUDA an illegal address) and go back once the graph
    is reset (then at least `nbytes` fewer reserved bytes)."""
    torch.accel.synchronize()
    torch.accel.empty_cache()
    reserved = torch.accel.memory_reserved()
    inputs.clear()
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() == reserved
    graph.replay()
    torch.accel.synchronize()
    graph.reset()
    torch.accel.empty_cache()
    assert torch.accel.memory_reserved() <= reserved - nbytes


def cpp_kernels_only(test: Callable[..., Any]) -> Callable[..., Any]:
    """For tests of what Inductor's C++ backend generates for accel (the host driver's kernels):
    skipped where accel's kernels are Triton (the cuda driver; test_compile_triton.py)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        from torch_accel._inductor import kernels

        if kernels() != "cpp":
            pytest.skip(
                "checks Inductor's C++ code for accel; its Triton code: test_compile_triton.py"
            )
        return test(*args, **kwargs)

    return run


def skip_in_triton_interpreter(reason: str) -> pytest.MarkDecorator:
    """Skips a compile test where accel's kernels run in Triton's interpreter (TRITON_INTERPRET=1
    with ACCEL_INDUCTOR_KERNELS=triton on the host driver), which cannot show what it checks."""
    import triton_interpreter  # test/

    triton_kernels = os.environ.get("ACCEL_INDUCTOR_KERNELS") == "triton"
    return pytest.mark.skipif(triton_interpreter.active() and triton_kernels, reason=reason)


def skip_unless_operators_capture() -> None:
    """Skips the calling test where accel has no executor for its operators (the emulated cuda
    driver's lane): they run through the CPU fallback, which graphs cannot capture."""
    import torch_accel

    if torch_accel.executor()[0] == "none":
        pytest.skip("operators run through the CPU fallback here, which graphs cannot capture")


def skip_unless_host_first_calls() -> None:
    """Skips the calling test unless accel's operators run on the host executor, whose first
    calls of a signature are the subject (the cuda executor launches every call at once)."""
    import torch_accel

    if torch_accel.executor()[0] != "host":
        pytest.skip("the host executor's first calls")


def skip_unless_cuda_driver() -> None:
    """Skips the calling test module unless accel runs on the cuda driver over a GPU, saying why."""
    import torch_accel

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU here", allow_module_level=True)
    if not torch_accel.is_available() or torch_accel.driver() != "cuda":
        pytest.skip(
            f"accel is not on the cuda driver (driver {torch_accel.driver()!r}, "
            f"{torch_accel.init_error() or 'run with ACCEL_DRIVER=cuda'})",
            allow_module_level=True,
        )


def train_classifier_like_the_cpu(
    make_model: Callable[[], torch.nn.Module],
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    compile_fn: Callable[[torch.nn.Module], Callable[..., torch.Tensor]] = torch.compile,
) -> tuple[torch.nn.Module, Callable[..., torch.Tensor], torch.nn.Module]:
    """Trains make_model() on accel through compile_fn(model) and a copy on the CPU eagerly (SGD
    with momentum, cross-entropy on batch(step) = (inputs, labels)), checking each step's loss;
    returns (accel model, its compiled form, CPU model)."""
    torch.manual_seed(0)
    model, reference = make_model(), make_model()
    reference.load_state_dict(model.state_dict())
    model.to("accel")
    compiled = compile_fn(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (model, reference)]
    for step in range(steps):
        x, y = batch(step)
        losses = []
        for m, o, dev in ((compiled, opts[0], "accel"), (reference, opts[1], "cpu")):
            loss = torch.nn.functional.cross_entropy(m(x.to(dev)), y.to(dev))
            loss.backward()
            o.step()
            o.zero_grad()
            losses.append(loss.item())
        torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    return model, compiled, reference


def small_mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


def compiled_mlp_trains_like_the_cpu(
    compile_fn: Callable, steps: int
) -> tuple[torch.nn.Sequential, torch.nn.Sequential]:
    """Trains an MLP on accel through ``compile_fn(model)`` and a copy on the CPU eagerly, with
    the same batches, checking each step's loss; returns (accel model, CPU model)."""
    torch.manual_seed(0)
    model, reference = small_mlp(), small_mlp()
    reference.load_state_dict(model.state_dict())
    model.to("accel")
    compiled = compile_fn(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        for m, o, data in ((compiled, opt, x.to("accel")), (reference, ref_opt, x)):
            loss = m(data).square().mean()
            loss.backward()
            o.step()
            o.zero_grad()
            if m is compiled:
                got = loss.item()
        torch.testing.assert_close(got, loss.item(), atol=1e-5, rtol=1e-5)
    return model, reference


# Checks of the kernel limits (ACCEL_MAX_KERNEL_BUFFERS=16) on the code torch.compile generates,
# for a fresh interpreter that defined `widths(code)` (the buffers each generated kernel takes):
# a 40-input sum splits into several kernels, a foreach Adam step stays within the limit, and a
# node that lowering merged past the limit is an error naming it. Prints "ok".
KERNEL_LIMIT_CHECKS = """
import torch
from torch._inductor.utils import run_and_get_code

def total(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out

xs = [torch.randn(256, device="accel") for _ in range(40)]
got, (code,) = run_and_get_code(torch.compile(total), *xs)
torch.testing.assert_close(got.cpu(), total(*[x.cpu() for x in xs]))
w = widths(code)
assert len(w) > 1 and max(w) <= 16, w

params = [torch.nn.Parameter(torch.randn(8, device="accel")) for _ in range(12)]
for p in params:
    p.grad = torch.randn(8, device="accel")
opt = torch.optim.Adam(params, lr=0.1, foreach=True)
_, (code,) = run_and_get_code(torch.compile(opt.step))
w = widths(code)
assert w and max(w) <= 16, w

torch._dynamo.reset()
with torch._inductor.config.patch(realize_acc_reads_threshold=64):
    try:
        torch.compile(total)(*xs)
    except Exception as e:
        assert "beyond accel's limits" in str(e), e
    else:
        raise AssertionError("a 40-input kernel compiled past a 16-buffer limit")
print("ok")
"""
