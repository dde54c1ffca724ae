"""torch.distributed on accel on the cuda driver: accl through NCCL on CUDA views of accel memory.

Every test here needs ACCEL_DRIVER=cuda and a GPU (test/gpu_proof.sh runs it); elsewhere the
module skips, saying why (test_distributed.py covers the host driver). Each rank takes its own
GPU, as NCCL requires: with one GPU the group has one rank, which still runs every collective
through NCCL's kernels on the accel stream.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers import skip_unless_cuda_driver
from torch_accel import distributed as accel_dist

skip_unless_cuda_driver()
if not accel_dist.is_available():
    pytest.skip("this torch has no NCCL or no Gloo", allow_module_level=True)

from test_distributed import check_broadcast_gathers_and_reduce_scatter, run_ranks  # noqa: E402
from test_distributed import ref as _ref  # noqa: E402
from test_distributed_training import run_ddp_example  # noqa: E402

WORLD = min(2, torch.cuda.device_count())


def _collectives(rank: int, world: int) -> str:
    dev = torch.device("accel", rank)
    torch.accel.set_device(dev)
    ranks = range(world)
    torch.accel.reset_fallback_stats()
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            t = _ref(rank, dtype=dtype).to(dev)
            dist.all_reduce(t, op=op)
            stacked = torch.stack([_ref(r, dtype=dtype) for r in ranks])
            expected = stacked.sum(0) if op == dist.ReduceOp.SUM else stacked.amax(0)
            torch.testing.assert_close(t.cpu(), expected.to(dtype), msg=f"{op} {dtype}")
    t = _ref(rank).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t.cpu(), torch.stack([_ref(r) for r in ranks]).mean(0))

    check_broadcast_gathers_and_reduce_scatter(rank, world, dev)
    out = torch.empty(4 * world, device=dev)
    dist.all_to_all_single(out, (torch.arange(4.0 * world) + 100 * rank).to(dev))
    expected = torch.cat([torch.arange(4.0) + 4 * rank + 100 * r for r in ranks])
    torch.testing.assert_close(out.cpu(), expected)
    outs = [torch.empty(3, device=dev) for _ in ranks]
    dist.all_to_all(outs, [torch.full((3,), 10.0 * rank + j, device=dev) for j in ranks])
    for j in ranks:
        torch.testing.assert_close(outs[j].cpu(), torch.full((3,), 10.0 * j + rank))
    if world > 1:
        peer, src = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(6, device=dev)
        ops = [dist.P2POp(dist.isend, _ref(rank).to(dev), peer)]
        ops.append(dist.P2POp(dist.irecv, got, src))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        torch.testing.assert_close(got.cpu(), _ref(src))

    # Async work: the future's value is the accel tensor itself.
    t = _ref(rank).to(dev)
    work = dist.all_reduce(t, async_op=True)
    value = work.get_future().wait()
    assert value[0].device == dev and value[0].data_ptr() == t.data_ptr()
    work.wait()
    torch.testing.assert_close(t.cpu(), torch.stack([_ref(r) for r in ranks]).sum(0))
    dist.barrier()
    obj: list[object] = [{"rank": rank}]
    dist.broadcast_object_list(obj, src=world - 1)
    assert obj == [{"rank": world - 1}]
    assert torch.accel.fallback_stats() == {}, torch.accel.fallback_stats()
    return accel_dist.inner_backend().name()


def _stream_order(rank: int, world: int) -> None:
    """NCCL starts once the caller's accel stream reached the collective (its input comes out of
    a chain of matmuls still running on a side stream), and work enqueued after wait() or after
    the future sees the result; the host does not block on the device for either."""
    dev = torch.device("accel", rank)
    torch.accel.set_device(dev)
    a = torch.randn(2048, 2048, device=dev) / 45
    total = float(sum(r + 1 for r in range(world)))
    side = torch.accel.Stream()
    side.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(side):
        x = a
        for _ in range(40):
            x = x @ a
        t = torch.full((1 << 20,), float(rank + 1), device=dev) + x.sum() * 0
        out = torch.empty(world << 20, device=dev)
        work = dist.all_gather_into_tensor(out, t, async_op=True)
        work.wait()
        doubled = out * 2
        fut = dist.all_reduce(t, async_op=True).get_future()
        summed = fut.then(lambda f: f.value()[0] + 1).wait()
    torch.accel.current_stream().wait_stream(side)
    expected = torch.cat([torch.full((1 << 20,), 2.0 * (r + 1)) for r in range(world)])
    torch.testing.assert_close(doubled.cpu(), expected)
    torch.testing.assert_close(summed.cpu(), torch.full((1 << 20,), total + 1))


def test_collectives_run_through_nccl_and_match_the_cpu() -> None:
    assert run_ranks(_collectives, world=WORLD) == ["nccl"] * WORLD


def test_nccl_collectives_follow_the_accel_stream() -> None:
    run_ranks(_stream_order, world=WORLD)


@pytest.mark.parametrize("flags", [[], ["--fsdp"]], ids=["ddp", "fsdp2"])
def test_ddp_example_matches_one_process_on_the_gpus(flags: list[str]) -> None:
    run_ddp_example(WORLD, flags, 300, ACCEL_DRIVER="cuda")
