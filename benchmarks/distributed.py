"""torch.distributed on accel (the accl backend) against Gloo on CPU tensors, 2 ranks on
loopback, measured in the same run (issue 13's goals).

  all_reduce <size>  bus bandwidth of all_reduce (sum, float32) on accel tensors through accl
                     against the same all_reduce on CPU tensors through Gloo, same process group
                     (goal: at least 0.9 of Gloo's), from 4 KiB (latency-bound: accl's
                     agreement check is one small point-to-point exchange, see ACCEL_DIST_CHECK) to
                     64 MiB
  ddp step           one training step of the quickstart transformer under DDP, accel against
                     CPU (ratio of step times; the issue sets no goal, 0.9 is shown as parity)

Prints the table of ratios (Gloo time / accl time: above 1 is faster) and writes JSON (default
benchmarks/results/distributed.json).

    python benchmarks/distributed.py [--json PATH]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ratios import report

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"4KiB": 4 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "64MiB": 64 << 20}
ROUNDS = 5


def _best(fn: Callable[[], None], iters: int, accel: bool) -> float:
    """Seconds per call of fn, the best of ROUNDS rounds of `iters` calls, ranks in step."""
    best = float("inf")
    for _ in range(ROUNDS):
        dist.barrier(device_ids=None)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        if accel:
            torch.accel.synchronize()
        best = min(best, (time.perf_counter() - start) / iters)
    return best


def _worker(rank: int, world: int, init: str, queue: object) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch_accel  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo,accel:accl", init_method=init, rank=rank, world_size=world)
    times: dict[str, tuple[float, float]] = {}
    for name, nbytes in SIZES.items():
        cpu = torch.ones(nbytes // 4)
        acc = torch.ones(nbytes // 4, device="accel")
        iters = max(3, min(200, (64 << 20) // nbytes))
        for _ in range(2):  # warm up both paths
            dist.all_reduce(cpu)
            dist.all_reduce(acc)
        gloo_s, accl_s = float("inf"), float("inf")
        for _ in range(4):  # alternate, so drift slows both alike
            gloo_s = min(gloo_s, _best(lambda t=cpu: dist.all_reduce(t), iters, False))
            accl_s = min(accl_s, _best(lambda t=acc: dist.all_reduce(t), iters, True))
        times[f"all_reduce {name}"] = (gloo_s, accl_s)

    sys.path.insert(0, str(ROOT / "examples"))
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel
    from transformer_lm import VOCAB, TinyLM, batches

    steps = {}
    for device in ("cpu", "accel"):
        torch.manual_seed(0)
        model = DistributedDataParallel(TinyLM().to(device))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = [(x.to(device), y.to(device)) for x, y in batches(4)]

        def step(model: torch.nn.Module = model, opt: torch.optim.Optimizer = opt,
                 data: list = data) -> None:  # fmt: skip
            for x, y in data:
                loss = F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        step()
        steps[device] = _best(step, 1, device == "accel") / len(data)
    times["ddp step"] = (steps["cpu"], steps["accel"])
    if rank == 0:
        queue.put(times)  # type: ignore[attr-defined]
    dist.destroy_process_group()


def measure() -> dict[str, tuple[float, float]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker, args=(r, 2, init, queue)) for r in range(2)]
        for p in procs:
            p.start()
        times = queue.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
    return times


def main() -> int:
    import torch_accel  # noqa: F401

    times = measure()
    goals = {name: 0.9 for name in times}
    return report(
        __doc__.splitlines()[0],
        ROOT / "benchmarks" / "results" / "distributed.json",
        [(name, lambda t=t: t) for name, t in times.items()],
        goals,
        ("gloo_cpu", "accl", "ratio"),
    )


if __name__ == "__main__":
    sys.exit(main())
