"""Training over accl: DDP (over a group of a bare init_process_group() too, and around a
compiled module), DDP's timing statistics, functional collectives and DTensor on an accel
device mesh, and examples/ddp_train.py under torchrun (DDP and FSDP2 against one process).
Ranks are spawned as in test_distributed.py, whose harness these tests use."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torch_accel
from torch_accel import distributed as accel_dist

pytestmark = [
    pytest.mark.skipif(not accel_dist.is_available(), reason="no Gloo in this torch"),
    pytest.mark.skipif(
        torch_accel.is_available() and torch_accel.driver() == "cuda",
        reason="the host driver's path (the cuda driver's: test_distributed_cuda.py)",
    ),
]

from test_distributed import run_ranks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _plain_init(rank: int, world: int) -> tuple[str, str]:
    t = torch.full((3,), float(rank), device="accel")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [float(sum(range(world)))] * 3
    # Object collectives and barrier go through accel tensors too.
    obj: list[object] = [{"from": rank}]
    dist.broadcast_object_list(obj, src=1)
    assert obj == [{"from": 1}]
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, rank * 10)
    assert gathered == [r * 10 for r in range(world)]
    dist.barrier()
    assert accel_dist.inner_backend().name() == "gloo"  # what moves the bytes
    pg = dist.distributed_c10d._get_default_group()
    return str(dist.get_backend()), pg._get_backend(torch.device("accel")).name()


def _ddp_after_plain_init(rank: int, world: int) -> dict[str, Any]:
    """DDP over the group a bare init_process_group() made, eager and around a compiled module:
    both train as one process on the combined batch."""
    import copy

    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.nn.parallel import DistributedDataParallel

    # torch 2.11 makes GLOO this group's default backend type though only accl is registered
    # (pytorch/pytorch#189193): DDP's constructor asked for it and failed.
    before = dist.group.WORLD.name()
    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )
    data = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(3)]

    def train(model: torch.nn.Module, dev: torch.device, shard: bool) -> list[torch.Tensor]:
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for x, y in data:
            if shard:
                x, y = x.chunk(world)[rank], y.chunk(world)[rank]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    expected = train(copy.deepcopy(base), torch.device("cpu"), shard=False)
    dev = torch.device("accel", rank % torch.accel.device_count())
    eager = train(DistributedDataParallel(copy.deepcopy(base).to(dev)), dev, shard=True)
    counter = CompileCounterWithBackend("aot_eager")
    inner = torch.compile(copy.deepcopy(base).to(dev), backend=counter)
    compiled = train(DistributedDataParallel(inner), dev, shard=True)
    for got in (eager, compiled):
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    return {"before": before, "after": dist.group.WORLD.name(), "graphs": counter.frame_count}


def _dtensor(rank: int, world: int) -> None:
    """Functional collectives and DTensor on an accel device mesh (what FSDP2 and tensor
    parallelism build on)."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("accel", (world,))
    t = torch.full((4,), float(rank + 1), device="accel")
    total = float(sum(r + 1 for r in range(world)))
    torch.testing.assert_close(funcol.all_reduce(t, "sum", mesh).cpu(), torch.full((4,), total))
    gathered = funcol.all_gather_tensor(t, 0, mesh)
    expected = torch.cat([torch.full((4,), float(r + 1)) for r in range(world)])
    torch.testing.assert_close(gathered.cpu(), expected)
    full = torch.arange(8.0 * world).view(4 * world, 2)
    dt = distribute_tensor(full.to("accel"), mesh, [Shard(0)])
    rows = full.shape[0] // world
    torch.testing.assert_close(dt.to_local().cpu(), full[rank * rows : (rank + 1) * rows])
    assert dt.to_local().device.type == "accel"
    torch.testing.assert_close(dt.redistribute(mesh, [Replicate()]).to_local().cpu(), full)
    torch.testing.assert_close((dt * 2).full_tensor().cpu(), full * 2)


def _tensor_parallel_attention(rank: int, world: int) -> list[str]:
    """F.scaled_dot_product_attention of DTensors sharded over heads or batch (tensor
    parallelism): accel takes ATen's CPU flash kernel, which torch 2.11's DTensor has no rule for;
    torch_accel's rules (distributed/tensor_sharding.py) shard it as CUDA's flash kernel is."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("accel", (world,))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, generator=gen, requires_grad=True) for _ in range(3))
    masks = {
        "causal": None,
        "mask over batch": torch.randn(2, 1, 8, 8, generator=gen),
        "mask over every head": torch.randn(2, 4, 8, 8, generator=gen),
    }
    placements = []
    for name, mask in masks.items():
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
        for placement in (Shard(1), Shard(0)):
            dq, dk, dv = (
                distribute_tensor(t.detach().to("accel"), mesh, [placement]).requires_grad_()
                for t in (q, k, v)
            )
            dmask = (
                None if mask is None else distribute_tensor(mask.to("accel"), mesh, [Replicate()])
            )
            out = F.scaled_dot_product_attention(
                dq, dk, dv, attn_mask=dmask, is_causal=mask is None
            )
            grads = torch.autograd.grad(out.sum(), (dq, dk, dv))
            torch.testing.assert_close(out.full_tensor().cpu(), expected)
            for got, want in zip(grads, expected_grads, strict=True):
                torch.testing.assert_close(got.full_tensor().cpu(), want)
            placements.append(f"{name} {placement}: {out.placements[0]}")
    # DTensor does not redistribute the mask (a keyword argument): a sharded one is refused.
    sharded = distribute_tensor(masks["mask over batch"].to("accel"), mesh, [Shard(0)])
    dq = distribute_tensor(q.detach().to("accel"), mesh, [Shard(0)])
    try:
        F.scaled_dot_product_attention(dq, dq, dq, attn_mask=sharded)
    except NotImplementedError as e:
        placements.append(str(e).split(";")[0])
    return placements


def _ddp_logging(rank: int, world: int) -> dict[str, int]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 8).to("accel"))
    for _ in range(11):
        model(torch.randn(16, 64, device="accel")).sum().backward()
    data = model._get_ddp_logging_data()
    return {
        k: data[k]
        for k in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time")
    }


# Tests.


def test_plain_init_process_group_picks_accl_for_accel() -> None:
    for _backend, accel_backend in run_ranks(_plain_init, backend=None):
        assert accel_backend == "accl", accel_backend


def test_ddp_trains_over_a_plain_init_process_group() -> None:
    for r in run_ranks(_ddp_after_plain_init, backend=None, limit_s=180.0):
        # Fails once torch picks a registered backend as the group's default itself: then
        # default_to_accel_backend in csrc/distributed/gloo_groups.cpp can go.
        assert r["before"] == "gloo", r
        assert r["after"] == "custom", r  # accl, at the group's first accel collective
        assert r["graphs"] == 1, r


def test_functional_collectives_and_dtensor() -> None:
    run_ranks(_dtensor)


def test_tensor_parallel_attention_shards_like_cudas_flash_kernel() -> None:
    for placements in run_ranks(_tensor_parallel_attention, limit_s=120.0):
        assert placements == [
            # heads shard where the mask broadcasts over them; the batch dimension too
            "causal S(1): S(1)",
            "causal S(0): S(0)",
            "mask over batch S(1): S(1)",
            "mask over batch S(0): R",
            "mask over every head S(1): R",
            "mask over every head S(0): R",
            "scaled_dot_product_attention of DTensors on accel: the attention mask must be "
            "replicated (its placements are (Shard(dim=0),))",
        ]


def test_ddp_reports_accel_times() -> None:
    for times in run_ranks(_ddp_logging):
        assert all(v > 0 for v in times.values()), times


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ddp_example(nproc: int, flags: list[str], timeout_s: float, **env: str) -> str:
    """Runs examples/ddp_train.py under torchrun with `nproc` ranks (and `env` added to this
    environment); checks that it exits cleanly and reports OK. Returns its output."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-port",
            str(_free_port()),
            str(ROOT / "examples" / "ddp_train.py"),
            "--steps",
            "10",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ, **env),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout.splitlines()
    return proc.stdout


@pytest.mark.parametrize("flags", [[], ["--fsdp"]], ids=["ddp", "fsdp2"])
def test_ddp_example_matches_one_process(flags: list[str]) -> None:
    out = run_ddp_example(2, flags, 180, GLOO_SOCKET_IFNAME="lo")
    assert "CPU fallback" not in out
