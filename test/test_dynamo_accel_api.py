"""torch.accel's device, stream and property functions inside torch.compile: traced without a
graph break (``fullgraph=True``), as torch.cuda's are (torch_accel/_dynamo/polyfills.py).

Dynamo's own behaviour is the subject here, not code generation, so the functions compile with
a counting backend that runs the captured graph eagerly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.testing import CompileCounter

pytestmark = pytest.mark.skipif(torch.accel.device_count() < 2, reason="needs two accel devices")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _device_facts(t: torch.Tensor) -> torch.Tensor:
    props = torch.accel.get_device_properties(0)
    major, _ = torch.accel.get_device_capability()
    scale = torch.accel.device_count() * props.multi_processor_count + major
    scale += len(torch.accel.get_device_name(1)) + len(props.uuid) - 36
    if torch.accel.is_available() and torch.accel.is_bf16_supported():
        t = t.to(torch.bfloat16).float()
    if torch.accel.is_tf32_supported():
        t = t * 0
    return t * scale


def test_device_queries_fold_into_constants() -> None:
    x = torch.randn(8, device="accel")
    counter = CompileCounter()
    got = torch.compile(_device_facts, fullgraph=True, backend=counter)(x)
    torch.testing.assert_close(got, _device_facts(x), rtol=0, atol=0)
    assert counter.frame_count == 1
    # Folded: the graph holds the arithmetic alone (bf16 round trip, one multiplication).
    assert counter.op_count == 3, counter.op_count


def _plus_device(t: torch.Tensor) -> torch.Tensor:
    return t + torch.accel.current_device()


def test_current_device_is_guarded_not_frozen() -> None:
    counter = CompileCounter()
    f = torch.compile(_plus_device, fullgraph=True, backend=counter)
    x0 = torch.zeros(3, device="accel:0")
    assert f(x0).cpu().tolist() == [0.0] * 3
    with torch.accel.device(1):
        x1 = torch.zeros(3, device="accel:1")
        assert f(x1).cpu().tolist() == [1.0] * 3
        assert f(x0).cpu().tolist() == [1.0] * 3  # the current device, not the tensor's
    # One graph per (tensor device, current device) pair met: guards, not a frozen answer.
    assert counter.frame_count == 3
    assert f(x0).cpu().tolist() == [0.0] * 3
    assert counter.frame_count == 3  # device 0's first graph serves again


def test_streams_and_synchronize_trace_as_torch_cuda_s() -> None:
    side = torch.accel.Stream(device=0)

    def on_side(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        before = torch.accel.current_stream()
        side.wait_stream(before)
        with torch.accel.stream(side):
            inside = torch.accel.current_stream(0)
            y = t * 2
        before.wait_stream(side)
        with torch.accel.stream(None):  # selects nothing
            z = y + 1
        after = torch.accel.current_stream(torch.device("accel:0"))
        torch.accel.set_stream(after)
        torch.accel.synchronize()
        return z, before, inside, after

    x = torch.randn(5, device="accel")
    counter = CompileCounter()
    z, before, inside, after = torch.compile(on_side, fullgraph=True, backend=counter)(x)
    assert counter.frame_count == 1
    torch.testing.assert_close(z, x * 2 + 1, rtol=0, atol=0)
    assert inside == side
    assert before == after == torch.accel.current_stream()
    assert before != side


def test_accel_stream_and_event_classes_break_the_graph_torch_s_do_not() -> None:
    # Dynamo builds streams and events in the graph only for a fixed list of classes
    # (torch.Stream, torch.Event and CUDA's, XPU's, HPU's): torch 2.11 has no registration for
    # another device's subclasses, so code that compiles whole uses the generic classes.
    x = torch.randn(4, device="accel")

    def generic(t: torch.Tensor) -> torch.Tensor:
        event = torch.Event(device="accel")
        y = t * 2
        event.record()
        event.wait()
        return y

    torch.testing.assert_close(torch.compile(generic, fullgraph=True, backend="eager")(x), x * 2)

    def accel_event(t: torch.Tensor) -> torch.Tensor:
        torch.accel.Event()
        return t * 2

    with pytest.raises(torch._dynamo.exc.Unsupported), pytest.warns(UserWarning):
        torch.compile(accel_event, fullgraph=True, backend="eager")(x)
    with pytest.warns(UserWarning, match="Dynamo does not know how to trace"):
        got = torch.compile(accel_event, backend="eager")(x)  # the graph breaks there
    torch.testing.assert_close(got, x * 2)


def test_registrations_waiting_for_one_module_all_run_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch._dynamo has two (this file's substitutes and _torch_fixes.py's): a second
    # registration for a module must not replace the first.
    from torch_accel._import_hook import after_import

    (tmp_path / "accel_hook_probe.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ran: list[str] = []
    after_import("accel_hook_probe", lambda: ran.append("first"))
    after_import("accel_hook_probe", lambda: ran.append("second"))
    assert ran == []
    import accel_hook_probe  # noqa: F401

    assert ran == ["first", "second"]
    after_import("accel_hook_probe", lambda: ran.append("now"))  # already imported: at once
    assert ran == ["first", "second", "now"]
    monkeypatch.delitem(sys.modules, "accel_hook_probe")


def test_accel_amp_autocast_traces_as_torch_autocast() -> None:
    a = torch.randn(4, 8, device="accel")
    b = torch.randn(8, 3, device="accel")

    def products(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.accel.amp.autocast(dtype=torch.bfloat16):
            low = x @ y
            with torch.accel.amp.autocast(enabled=False):
                full = x @ y
        return low, full

    @torch.accel.amp.autocast()  # the decorator form, float16 by default
    def half(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y

    counter = CompileCounter()
    low, full = torch.compile(products, fullgraph=True, backend=counter)(a, b)
    assert counter.frame_count == 1
    assert (low.dtype, full.dtype) == (torch.bfloat16, torch.float32)
    torch.testing.assert_close(low, (a.bfloat16() @ b.bfloat16()), rtol=0, atol=0)
    torch.testing.assert_close(full, a @ b, rtol=0, atol=0)
    got = torch.compile(half, fullgraph=True, backend="eager")(a, b)
    assert got.dtype == torch.float16
    assert not torch.is_autocast_enabled("accel")
