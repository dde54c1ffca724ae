"""torch.multiprocessing of accel tensors: queues and Process arguments share device memory.

One spawned child serves every request of a test module (spawning costs an interpreter start):
the parent sends it accel tensors, the child answers with CPU copies of what it sees, changes
them in place, holds them, or sends accel tensors of its own back. Values are compared with the
parent's CPU results; the sharing (no copy) shows in writes seen on the other side.
"""

from __future__ import annotations

import gc
import os
import pickle
import textwrap
import time

import pytest
import torch
import torch.multiprocessing as mp

import torch_accel
from helpers import LAUNCH_BLOCKING, pending_behind_a_sleep
from torch_accel import _C

TIMEOUT = 120


def _answer(kind, payload, held, model):
    if kind == "values":
        return [(t.cpu(), t.stride(), t.storage_offset(), str(t.device)) for t in payload]
    if kind == "add_one":
        payload.add_(1)
        torch.accel.synchronize()
        return "done"
    if kind == "same_storage":
        a, b = payload
        return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), b.cpu())
    if kind == "hold":
        held.append(payload)
        return "held"
    if kind == "held_values":
        return [t.cpu() for t in held]
    if kind == "release":
        held.clear()
        return "released"
    if kind == "wait_then_read":  # the parent's interprocess event orders this read
        payload.wait()  # on this process's current stream
        return held[-1].cpu(), payload.query()
    if kind == "record_on_my_stream":  # a record here, of the parent's event
        payload.record()
        payload.synchronize()
        return payload.query()
    if kind == "make":
        return torch.arange(6.0, device="accel").reshape(2, 3) * payload
    if kind == "sgd_step":  # Hogwild: one step on the model the parent passed at spawn
        x, y = payload
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        torch.accel.synchronize()
        return loss.item()
    raise ValueError(kind)


def _serve(inbox, outbox, model) -> None:
    held = []
    while (msg := inbox.get()) is not None:
        reply = _answer(*msg, held, model)
        # What the parent sent is released (unless held) before the parent hears back.
        del msg
        gc.collect()
        torch.accel.synchronize()
        outbox.put(reply)


@pytest.fixture(scope="module")
def child():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("accel")
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_serve, args=(inbox, outbox, model), daemon=True)
    proc.start()

    def ask(kind, payload=None):
        inbox.put((kind, payload))
        return outbox.get(timeout=TIMEOUT)

    ask.model = model
    yield ask
    inbox.put(None)
    proc.join(timeout=TIMEOUT)
    assert proc.exitcode == 0


def test_tensors_reach_the_child_with_their_values_and_layout(child) -> None:
    base = torch.arange(24.0).reshape(4, 6)
    x = base.to("accel")
    sent = [
        x,
        x[1:3, 2:5],  # a view with a storage offset
        x.t(),  # non-contiguous
        base.to(torch.bfloat16).to("accel"),
        (x > 10),
        torch.tensor([], device="accel"),
        torch.arange(5, device="accel:1") * 7,
    ]
    got = child("values", sent)
    for s, (g, stride, offset, device) in zip(sent, got, strict=True):
        assert (stride, offset, device) == (s.stride(), s.storage_offset(), str(s.device))
        assert g.dtype == s.dtype and torch.equal(g, s.cpu())


def test_the_child_writes_the_parents_memory(child) -> None:
    x = torch.arange(8.0, device="accel")
    assert child("add_one", x) == "done"
    assert x.cpu().tolist() == [float(i + 1) for i in range(8)]
    # A view's writes land inside the parent's tensor.
    assert child("add_one", x[2:4]) == "done"
    assert x.cpu().tolist() == [1.0, 2.0, 4.0, 5.0, 5.0, 6.0, 7.0, 8.0]


def test_tensors_of_one_storage_share_it_in_the_child(child) -> None:
    w = torch.randn(3, 4, device="accel")
    same, view = child("same_storage", (w, w[1]))
    assert same
    assert torch.equal(view, w[1].cpu())


def test_memory_freed_while_the_child_holds_it_is_not_reused(child) -> None:
    torch.accel.ipc_collect()
    assert _C._ipc_pending(0) == 0  # the child released everything earlier tests sent
    y = torch.full((1024,), 3.0, device="accel")
    assert child("hold", y) == "held"
    del y
    gc.collect()
    assert _C._ipc_pending(0) == 1  # kept out of reuse
    others = [torch.full((1024,), -1.0, device="accel") for _ in range(16)]
    (held,) = child("held_values")
    assert torch.equal(held, torch.full((1024,), 3.0))
    assert child("release") == "released"
    torch.accel.ipc_collect()
    assert _C._ipc_pending(0) == 0
    assert all(o.sum().item() == -1024.0 for o in others)


def test_an_interprocess_event_orders_the_childs_read_after_the_parents_work(child) -> None:
    x = torch.zeros(256, 256, device="accel")
    assert child("hold", x) == "held"
    ready = torch.accel.Event(interprocess=True)
    a = torch.randn(256, 256, device="accel")
    # Each operator's first call here runs synchronously (accel learns its output's layout),
    # so the copy is made once before the stream is held busy; and only a copy follows the
    # sleep (without an executor, as on the emulated cuda driver, the CPU fallback of an
    # operator would wait for the sleep to end).
    expected = torch.tanh(a @ a)
    torch.empty_like(x).copy_(expected)
    pending, _ = pending_behind_a_sleep(  # the stream is busy for 0.3 s, then writes
        lambda: (x.copy_(expected), ready.record()), ready.query, 300_000_000
    )
    assert pending != LAUNCH_BLOCKING  # launch-blocking ran it all already
    # The child's copy to the CPU waits on its stream for the record, not for the sharing.
    seen, done = child("wait_then_read", ready)
    assert done
    assert torch.equal(seen, expected.cpu())
    assert child("release") == "released"
    # A record in the child is the parent's event's latest record too.
    assert child("record_on_my_stream", ready)
    assert ready.query()


def _record_after_a_sleep(handle, to_parent, from_parent) -> None:
    # The parent's event, opened here, recorded behind 0.3 s of work on a stream of this process.
    event = torch.accel.Event.from_ipc_handle(0, handle)
    with torch.accel.stream(torch.accel.Stream()):
        to_parent.put(pending_behind_a_sleep(event.record, event.query, 300_000_000))
    from_parent.get()  # the parent synchronized: the event may go


def _wait_for_the_parents_record(event, to_parent, from_parent) -> None:
    # The parent's event, sent as a Process argument.
    to_parent.put("ready")
    from_parent.get()
    event.synchronize()
    to_parent.put(event.query())


@pytest.mark.skipif(LAUNCH_BLOCKING, reason="launch-blocking leaves no record pending to wait for")
def test_interprocess_events_are_recorded_and_synchronized_in_either_process() -> None:
    ctx = mp.get_context("spawn")
    to_parent, from_parent = ctx.SimpleQueue(), ctx.SimpleQueue()
    exported = torch.accel.Event(interprocess=True)
    child = ctx.Process(
        target=_record_after_a_sleep, args=(exported.ipc_handle(), to_parent, from_parent)
    )
    child.start()
    pending, busy_until = to_parent.get()
    assert pending  # the child's record is pending there...
    pending_here = not exported.query()
    if time.monotonic() < busy_until:  # (a loaded machine may ask after the child's sleep)
        assert pending_here  # ...and so here
    exported.synchronize()  # waits for the child's stream
    assert exported.query()
    from_parent.put("done")
    child.join(TIMEOUT)
    assert child.exitcode == 0

    shared = torch.accel.Event(interprocess=True)
    assert shared.query()  # never recorded
    child = ctx.Process(target=_wait_for_the_parents_record, args=(shared, to_parent, from_parent))
    child.start()
    assert to_parent.get() == "ready"
    pending, _ = pending_behind_a_sleep(shared.record, shared.query, 300_000_000)
    assert pending
    from_parent.put("recorded")
    assert to_parent.get() is True  # the child's synchronize waited for this stream
    assert shared.query()
    child.join(TIMEOUT)
    assert child.exitcode == 0


def test_interprocess_event_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="cannot time"):
        torch.accel.Event(interprocess=True, enable_timing=True)
    with pytest.raises(ValueError, match="not an interprocess event"):
        torch.accel.Event().ipc_handle()
    with pytest.raises(ValueError, match="not an interprocess event"):
        pickle.dumps(torch.accel.Event())
    ev = torch.accel.Event(interprocess=True)
    handle = ev.ipc_handle()
    assert isinstance(handle, bytes) and len(handle) == 64
    with pytest.raises(RuntimeError, match="names an event of this process"):
        torch.accel.Event.from_ipc_handle(0, handle)
    with pytest.raises(ValueError, match="64 bytes"):
        torch.accel.Event.from_ipc_handle(0, b"short")
    with pytest.raises(RuntimeError, match="on device 9"):
        torch.accel.Event.from_ipc_handle(9, handle)
    # torch's generic paths reach it: torch.Stream.wait_event and torch.Event.wait.
    torch.accelerator.current_stream().wait_event(ev)
    ev.record()
    ev.wait(torch.accel.Stream())
    ev.synchronize()
    assert ev.query()
    with pytest.raises(RuntimeError, match="without timing"):
        ev.elapsed_time(ev)


def test_tensors_the_child_makes_reach_the_parent(child) -> None:
    got = child("make", 2.0)
    assert got.device == torch.device("accel", 0)
    assert torch.equal(got.cpu(), torch.arange(6.0).reshape(2, 3) * 2)
    assert (got + 1).sum().item() == 36.0


def test_a_model_passed_to_the_child_trains_in_place(child) -> None:
    model = child.model
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    loss = child("sgd_step", (x.to("accel"), y.to("accel")))
    expected = torch.nn.functional.mse_loss(reference(x), y)
    expected.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    assert loss == pytest.approx(expected.item(), rel=1e-5)
    for p, r in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), r.detach())


EXPANDABLE = """
import torch, torch_accel
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

def child(q, r):
    t = q.get()
    r.put((t[:2].cpu().tolist(), t.sum().item()))  # values, not a CPU tensor (shared memory)
    t.mul_(2)
    torch.accel.synchronize()
    r.put("done")

if __name__ == "__main__":
    x = torch.arange(1 << 20, dtype=torch.float32, device="accel")[8:]  # 4 MiB, an offset
    try:  # a queue pickles in a thread of its own, where an error is only printed
        ForkingPickler.dumps(x)
    except RuntimeError as e:
        print("refused:", e)
    else:
        ctx = mp.get_context("spawn")
        q, r = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child, args=(q, r))
        p.start()
        q.put(x)
        seen = r.get(timeout=120)
        assert r.get(timeout=120) == "done"
        p.join()
        expected = torch.arange(8.0, 1 << 20, dtype=torch.float64).sum().item()
        print(seen[0], abs(seen[1] - expected) < 1e-5 * expected, x[:3].cpu().tolist())
    print((x[:2] + 1).cpu().tolist())
"""


def test_expandable_segments_are_shared_or_refused_with_the_reason(run_python, tmp_path) -> None:
    script = tmp_path / "expandable.py"  # spawn children import the parent's main module
    script.write_text(EXPANDABLE)
    result = run_python(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        PYTORCH_ALLOC_CONF="expandable_segments:True",
        **{k: v for k, v in os.environ.items() if k in ("ACCEL_DRIVER", "ACCEL_DRIVER_PATH")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    if torch_accel.driver() == "cuda":  # cuMem* memory: not shared (yet), and says so
        assert "expandable segments" in lines[0] and "cannot share" in lines[0]
        assert lines[-1] == "[9.0, 10.0]"
    else:  # the host driver: the reservation's memory file
        assert lines == ["[8.0, 9.0] True [16.0, 18.0, 20.0]", "[17.0, 19.0]"]


def test_a_sender_that_exited_before_the_receiver_opened_is_named(run_python) -> None:
    # The pickle of a process that exits at once: its memory is gone before anyone mapped it.
    result = run_python(
        textwrap.dedent(
            """
            import sys, torch
            from multiprocessing.reduction import ForkingPickler
            sys.stdout.write(bytes(ForkingPickler.dumps(torch.ones(3, device="accel"))).hex())
            """
        )
    )
    assert result.returncode == 0, result.stderr
    with pytest.raises(RuntimeError, match="has exited"):
        pickle.loads(bytes.fromhex(result.stdout.strip()))
    assert (torch.ones(2, device="accel") * 2).sum().item() == 4.0


class _Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.arange(3.0, device="accel") + i * i


def test_dataloader_workers_make_accel_batches_that_outlive_them() -> None:
    # Spawned workers build accel tensors; the batches they send stay valid after they exit
    # (a CUDA tensor would not outlive the process that made it).
    loader = torch.utils.data.DataLoader(
        _Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn"
    )
    batches = list(loader)  # the workers have exited once the iterator is exhausted
    gc.collect()
    expected = torch.stack([torch.arange(3.0) + i * i for i in range(6)])
    assert all(b.device == torch.device("accel", 0) for b in batches)
    assert torch.equal(torch.cat(batches).cpu(), expected)
    assert torch.equal(torch.cat(batches).sum(0).cpu(), expected.sum(0))
