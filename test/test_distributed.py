"""torch.distributed on accel tensors: the accl backend (Gloo on accel memory, in stream order).

Each test spawns its ranks as processes on loopback (a file store, GLOO_SOCKET_IFNAME=lo), runs
a worker function in each and collects what each returned or raised, bounded in time. Results
are compared with values computed on the CPU.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import torch_accel
from torch_accel import distributed as accel_dist

pytestmark = [
    pytest.mark.skipif(not accel_dist.is_available(), reason="no Gloo in this torch"),
    # Two ranks share accel:0 here, which NCCL refuses: test_distributed_cuda.py covers cuda.
    pytest.mark.skipif(
        torch_accel.is_available() and torch_accel.driver() == "cuda",
        reason="the host driver's path (the cuda driver's: test_distributed_cuda.py)",
    ),
]


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    init: str,
    backend: str | None,
    timeout_s: float,
    queue: Any,
    env: dict[str, str],
) -> None:
    os.environ.clear()  # the test's environment, not the one the fork server started with
    os.environ.update(env)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        import torch_accel  # noqa: F401

        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        result = fn(rank, world)
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - reported to the test
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _rank_context() -> Any:
    """Where ranks come from: multiprocessing's fork server, which imports torch, torch_accel
    and this module once per test process and forks each rank from there (each spawned rank
    spent seconds importing them: the ranks of make test's 40 distributed tests imported torch
    80 times). The server has not started the accel runtime (importing starts nothing), so its
    children start their own, as spawned ones do; each rank takes the test's environment
    (_entry); nor has it initialized CUDA, which is what makes forking unsafe for the cuda
    driver's ranks."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch_accel", __name__])
    return ctx


def run_ranks(
    fn: Callable[[int, int], Any],
    world: int = 2,
    backend: str | None = "cpu:gloo,accel:accl",
    timeout_s: float = 20.0,
    limit_s: float = 90.0,
    leaving: tuple[int, ...] = (),
) -> list[Any]:
    """Runs fn(rank, world) in `world` processes; returns their results by rank, or fails with
    the tracebacks of those that raised (or did not answer within limit_s). Ranks in `leaving`
    exit on purpose without answering (their result is None)."""
    ctx = _rank_context()
    queue = ctx.Queue()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(fn, r, world, init, backend, timeout_s, queue, env))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + limit_s
        expected = world - len(leaving)
        try:
            while len(results) < expected and time.monotonic() < deadline:
                try:
                    rank, ok, value = queue.get(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - queue.Empty: the deadline passed
                    break
                results[rank] = (ok, value)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    missing = [r for r in range(world) if r not in results and r not in leaving]
    assert not missing, f"ranks {missing} did not finish within {limit_s} s"
    errors = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(results.items()) if not ok]
    assert not errors, "\n".join(errors)
    return [results[r][1] if r in results else None for r in range(world)]


# Workers (module level: the spawned processes import them).


def ref(r: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What rank r contributes to a collective (distinct per rank and element)."""
    return (torch.arange(n, dtype=torch.float64) * (r + 1) + r).to(dtype)


def check_broadcast_gathers_and_reduce_scatter(rank: int, world: int, dev: torch.device) -> None:
    """broadcast, all_gather, all_gather_into_tensor and reduce_scatter_tensor on `dev` against
    the values the CPU computes."""
    ranks = range(world)
    t = ref(rank).to(dev)
    dist.broadcast(t, src=world - 1)
    torch.testing.assert_close(t.cpu(), ref(world - 1))
    outs = [torch.empty(6, device=dev) for _ in ranks]
    dist.all_gather(outs, ref(rank).to(dev))
    for r in ranks:
        torch.testing.assert_close(outs[r].cpu(), ref(r))
    out = torch.empty(world * 6, device=dev)
    dist.all_gather_into_tensor(out, ref(rank).to(dev))
    torch.testing.assert_close(out.cpu(), torch.cat([ref(r) for r in ranks]))
    full = [ref(r, n=6 * world) for r in ranks]
    out = torch.empty(6, device=dev)
    dist.reduce_scatter_tensor(out, full[rank].to(dev))
    torch.testing.assert_close(out.cpu(), torch.stack(full).sum(0)[rank * 6 : (rank + 1) * 6])


def _collectives(rank: int, world: int) -> None:
    dev = torch.device("accel", 0)
    ranks = range(world)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32):
        for op, combine in (
            (dist.ReduceOp.SUM, torch.stack),
            (dist.ReduceOp.MAX, torch.stack),
            (dist.ReduceOp.MIN, torch.stack),
            (dist.ReduceOp.PRODUCT, torch.stack),
        ):
            t = ref(rank, dtype=dtype).to(dev)
            dist.all_reduce(t, op=op)
            stacked = combine([ref(r, dtype=dtype) for r in ranks])
            expected = {
                dist.ReduceOp.SUM: stacked.sum(0),
                dist.ReduceOp.MAX: stacked.amax(0),
                dist.ReduceOp.MIN: stacked.amin(0),
                dist.ReduceOp.PRODUCT: stacked.prod(0),
            }[op].to(dtype)
            torch.testing.assert_close(t.cpu(), expected, msg=f"all_reduce {op} {dtype}")
    for op, fold in (
        (dist.ReduceOp.BAND, torch.bitwise_and),
        (dist.ReduceOp.BOR, torch.bitwise_or),
        (dist.ReduceOp.BXOR, torch.bitwise_xor),
    ):
        t = torch.tensor([0b1100 | rank, 0b1010 + rank], device=dev)
        dist.all_reduce(t, op=op)
        values = [torch.tensor([0b1100 | r, 0b1010 + r]) for r in ranks]
        expected = values[0]
        for v in values[1:]:
            expected = fold(expected, v)
        torch.testing.assert_close(t.cpu(), expected, msg=f"all_reduce {op}")
    t = ref(rank).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t.cpu(), torch.stack([ref(r) for r in ranks]).mean(0))
    # Small tensors travel inside the agreement message (reduced locally, one round trip);
    # these are past its 4 KiB and take Gloo's all_reduce.
    for n, dtype in ((3000, torch.float64), (10000, torch.bfloat16), (5000, torch.int32)):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            t = ref(rank, n=n, dtype=dtype).to(dev)
            dist.all_reduce(t, op=op)
            stacked = torch.stack([ref(r, n=n, dtype=dtype) for r in ranks])
            expected = stacked.sum(0) if op == dist.ReduceOp.SUM else stacked.amax(0)
            torch.testing.assert_close(t.cpu(), expected.to(dtype), msg=f"{n} {dtype} {op}")

    check_broadcast_gathers_and_reduce_scatter(rank, world, dev)
    full = [ref(r, n=6 * world) for r in ranks]
    out = torch.empty(6, device=dev)
    dist.reduce_scatter(out, [c.to(dev) for c in full[rank].chunk(world)])
    torch.testing.assert_close(out.cpu(), torch.stack(full).sum(0)[rank * 6 : (rank + 1) * 6])

    # all_to_all_single with uneven splits: rank r sends r + j + 1 rows to rank j.
    def sends(r: int) -> list[int]:
        return [r + j + 1 for j in ranks]

    rows = torch.arange(sum(sends(rank)), dtype=torch.float32) + 100 * rank
    inp = torch.stack([rows, -rows], 1)
    out = torch.empty(sum(sends(r)[rank] for r in ranks), 2, device=dev)
    dist.all_to_all_single(out, inp.to(dev), [sends(r)[rank] for r in ranks], sends(rank))
    pieces = []
    for r in ranks:
        src = torch.arange(sum(sends(r)), dtype=torch.float32) + 100 * r
        start = sum(sends(r)[:rank])
        part = src[start : start + sends(r)[rank]]
        pieces.append(torch.stack([part, -part], 1))
    torch.testing.assert_close(out.cpu(), torch.cat(pieces))
    # all_to_all on lists (point-to-point messages; Gloo has none): rank r sends j + r + 1
    # elements to rank j, all of value 100 * r + j.
    outs = [torch.empty(rank + j + 1, device=dev) for j in ranks]
    dist.all_to_all(
        outs, [torch.full((j + rank + 1,), 100.0 * rank + j, device=dev) for j in ranks]
    )
    for j in ranks:
        torch.testing.assert_close(outs[j].cpu(), torch.full((rank + j + 1,), 100.0 * j + rank))

    gathered = [torch.empty(6, device=dev) for _ in ranks] if rank == 0 else None
    dist.gather(ref(rank).to(dev), gathered, dst=0)
    if rank == 0:
        assert gathered is not None
        for r in ranks:
            torch.testing.assert_close(gathered[r].cpu(), ref(r))
    out = torch.empty(6, device=dev)
    dist.scatter(out, [ref(r).to(dev) for r in ranks] if rank == 1 else None, src=1)
    torch.testing.assert_close(out.cpu(), ref(rank))
    t = ref(rank).to(dev)
    dist.reduce(t, dst=1)
    if rank == 1:
        torch.testing.assert_close(t.cpu(), torch.stack([ref(r) for r in ranks]).sum(0))

    # Point to point, blocking and async (both send first: Gloo's sends do not wait).
    peer = (rank + 1) % world
    src = (rank - 1) % world
    got = torch.empty(6, device=dev)
    send = dist.isend(ref(rank).to(dev), dst=peer)
    recv = dist.irecv(got, src=src)
    send.wait()
    recv.wait()
    torch.testing.assert_close(got.cpu(), ref(src))
    if rank == 0:
        dist.send(ref(7).to(dev), dst=1)
    elif rank == 1:
        got = torch.empty(6, device=dev)
        assert dist.recv(got) == 0  # from any source: the sender's rank
        torch.testing.assert_close(got.cpu(), ref(7))

    # Async work: wait(), the future's value (the accel tensors, on accel).
    t = ref(rank).to(dev)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert work.wait()
    assert work.is_completed()
    value = fut.wait()
    assert value[0].device == dev and value[0].data_ptr() == t.data_ptr()
    torch.testing.assert_close(value[0].cpu(), torch.stack([ref(r) for r in ranks]).sum(0))

    # Coalesced collectives (one work for several).
    a, b = ref(rank).to(dev), ref(rank, n=3).to(dev)
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    torch.testing.assert_close(a.cpu(), torch.stack([ref(r) for r in ranks]).sum(0))
    torch.testing.assert_close(b.cpu(), torch.stack([ref(r, n=3) for r in ranks]).sum(0))

    dist.barrier()
    obj: list[object] = [{"rank": rank}]
    dist.broadcast_object_list(obj, src=1)
    assert obj == [{"rank": 1}]


def _stream_order(rank: int, world: int) -> None:
    """A collective waits for the work enqueued before it on the caller's stream (here a side
    stream still busy with a chain of matmuls that produces its input), and work after wait()
    sees its result; the default stream is not synchronized meanwhile."""
    dev = torch.device("accel", 0)
    a = torch.randn(384, 384, device=dev) / 20
    side = torch.accel.Stream()
    side.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(side):
        x = a
        for _ in range(30):
            x = x @ a
        t = torch.full((1000,), float(rank + 1), device=dev) + x.sum() * 0
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        doubled = t * 2
    torch.accel.current_stream().wait_stream(side)
    total = sum(r + 1 for r in range(world))
    torch.testing.assert_close(doubled.cpu(), torch.full((1000,), 2.0 * total))


def _mismatch(rank: int, world: int) -> list[str]:
    """Shape and dtype mismatches across ranks raise ValueError on every rank, naming both;
    a CPU tensor among accel ones, an unsupported reduction and a collective inside a graph
    capture are refused; the device and the group stay usable."""
    dev = torch.device("accel", 0)
    messages = []
    for t in (
        torch.ones(4 + rank * 1000, device=dev),
        torch.ones(4, device=dev, dtype=torch.float32 if rank == 0 else torch.float64),
    ):
        try:
            dist.all_reduce(t)
            raise AssertionError("no error for a mismatch across ranks")
        except ValueError as e:
            messages.append(str(e))
    try:
        dist.all_gather([torch.empty(4), torch.empty(4)], torch.ones(4, device=dev))
        raise AssertionError("no error for a CPU tensor")
    except ValueError as e:
        messages.append(str(e))
    try:
        dist.all_reduce(torch.ones(3, 4, device=dev)[:, 1])
        raise AssertionError("no error for a non-contiguous tensor")
    except ValueError as e:
        messages.append(str(e))
    try:
        dist.all_reduce(torch.ones(4, device=dev), op=dist._make_nccl_premul_sum(2.0))
        raise AssertionError("no error for PREMUL_SUM")
    except RuntimeError as e:
        messages.append(str(e))
    # all_to_all whose receive sizes do not match what the peers send (rank 1 expects 3
    # elements from rank 0, which sends 2).
    try:
        outs = [torch.empty(3 if rank == 1 and j != rank else 2, device=dev) for j in range(world)]
        dist.all_to_all(outs, [torch.ones(2, device=dev) for _ in range(world)])
        raise AssertionError("no error for mismatched all_to_all sizes")
    except ValueError as e:
        messages.append(str(e))
    g = torch.accel.AccelGraph()
    x = torch.ones(4, device=dev)
    try:
        with torch.accel.graph(g):
            dist.all_reduce(x)
        raise AssertionError("a collective was captured")
    except torch_accel.CaptureError as e:
        messages.append(str(e))
    t = torch.ones(4, device=dev)
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), torch.full((4,), float(world)))
    return messages


def _three_ranks(rank: int, world: int) -> str:
    """Three ranks: the agreement messages go to every peer point to point, on a tag of their own
    (a user's send still pending on tag 0 is not taken for one); a mismatch on one rank raises on
    all three."""
    dev = torch.device("accel", 0)
    pending = dist.isend(torch.full((4,), 7.0, device=dev), dst=1) if rank == 0 else None
    t = torch.full((1 << 16,), float(rank + 1), device=dev)  # above the inline size
    dist.all_reduce(t)
    torch.testing.assert_close(t.cpu(), torch.full((1 << 16,), 6.0))
    if rank == 1:
        got = torch.empty(4, device=dev)
        dist.recv(got, src=0)
        torch.testing.assert_close(got.cpu(), torch.full((4,), 7.0))
    if pending is not None:
        pending.wait()
    _collectives(rank, world)
    try:
        dist.all_reduce(torch.ones(8 if rank == 2 else 4, device=dev))
        raise AssertionError("no error for a mismatch on rank 2")
    except ValueError as e:
        return str(e)


def _failing_all_reduce() -> tuple[str, str, float]:
    """The error type, message and seconds of an all_reduce expected to fail."""
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4, device="accel"))
    except dist.DistBackendError as e:
        return type(e).__name__, str(e), time.monotonic() - start
    raise AssertionError("the all_reduce did not fail")


def _peer_gone(rank: int, world: int) -> tuple[str, str, float]:
    """Rank 1 leaves; rank 0's next collective fails with DistBackendError within the timeout.
    Rank 1 leaves once rank 0's init_process_group returned: a rank can return from it first,
    and leaving then failed rank 0's own connection set-up instead (Gloo's connectFullMesh:
    "Connection closed by peer")."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 1:
        store.wait(["rank 0 joined"])
        os._exit(0)
    store.set("rank 0 joined", "1")
    return _failing_all_reduce()


def _peer_silent(rank: int, world: int) -> tuple[str, str, float] | None:
    """Rank 1 stays alive but never joins the collective: rank 0 times out (2 s), no hang."""
    if rank == 1:
        time.sleep(4)
        return None
    return _failing_all_reduce()


def _shutdown_with_work_pending(rank: int, world: int) -> str:
    """destroy_process_group while a collective still waits for its stream: a collective that
    started completes, one still queued fails naming the shutdown; nothing hangs and the device
    stays usable."""
    dev = torch.device("accel", 0)
    a = torch.randn(384, 384, device=dev) / 20
    x = a
    for _ in range(20):
        x = x @ a  # keeps the stream busy
    t = torch.ones(5000, device=dev) + x.sum() * 0
    work = dist.all_reduce(t, async_op=True)
    dist.destroy_process_group()
    try:
        work.wait()
        outcome = "completed"
    except (dist.DistBackendError, RuntimeError) as e:
        outcome = str(e)
    assert torch.ones(3, device=dev).sum().item() == 3.0
    return outcome


# Tests.


@pytest.mark.parametrize("check", ["1", "0"], ids=["checked", "unchecked"])
def test_collectives_match_the_cpu(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Unchecked, every collective goes straight to Gloo (small all_reduces included).
    monkeypatch.setenv("ACCEL_DIST_CHECK", check)
    run_ranks(_collectives)


def test_collectives_follow_the_callers_stream() -> None:
    run_ranks(_stream_order)


def test_mismatches_and_misuse_raise_clear_errors_on_every_rank() -> None:
    for messages in run_ranks(_mismatch):
        shape, dtype, cpu, strided, premul, splits, capture = messages
        assert "rank 0: allreduce (SUM) of Float, 4 elements" in shape.replace(
            "ALLREDUCE", "allreduce"
        )
        assert "1004 elements" in shape
        assert "Double" in dtype and "Float" in dtype
        assert "got a tensor on cpu" in cpu
        assert "contiguous" in strided
        assert "PREMUL_SUM" in premul
        assert "split sizes" in splits and "sends [2,2] elements" in splits, splits
        assert "allreduce" in capture and "captur" in capture


def test_three_ranks_agree_and_disagree() -> None:
    for message in run_ranks(_three_ranks, world=3):
        assert "rank 0: allreduce (SUM) of Float, 4 elements" in message.replace(
            "ALLREDUCE", "allreduce"
        ), message
        assert "rank 2: allreduce (SUM) of Float, 8 elements" in message.replace(
            "ALLREDUCE", "allreduce"
        ), message


def test_a_peer_that_left_fails_the_collective() -> None:
    results = run_ranks(_peer_gone, timeout_s=5, leaving=(1,))
    kind, message, seconds = results[0]
    assert kind == "DistBackendError" and "accl" in message, message
    assert seconds < 5 + 3


def test_a_peer_that_never_joins_times_out() -> None:
    results = run_ranks(_peer_silent, timeout_s=2)
    kind, message, seconds = results[0]
    assert kind == "DistBackendError" and "accl" in message, message
    assert 1.5 < seconds < 2 + 2


def test_shutdown_with_pending_work_does_not_hang() -> None:
    for outcome in run_ranks(_shutdown_with_work_pending, timeout_s=5, limit_s=60):
        assert outcome == "completed" or "shut down" in outcome or "accl" in outcome, outcome


def test_the_agreement_check_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_DIST_CHECK", "0")
    assert accel_dist._check_enabled() is False
    monkeypatch.setenv("ACCEL_DIST_CHECK", "maybe")
    with pytest.raises(ValueError, match="ACCEL_DIST_CHECK"):
        accel_dist._check_enabled()
