"""Data-parallel training on accel: the quickstart model under DDP (or FSDP2) with torchrun.

Each rank trains the quickstart transformer (examples/transformer_lm.py) on its half of every
batch, on its own accel device when there are enough (``accel:<local rank>``), otherwise all on
``accel:0``. Gradients are averaged by accel's ``accl`` process-group backend (Gloo on the accel
buffers themselves on the host driver). Rank 0 then trains the same model in one process on
the combined batches and checks that the losses agree (averaged over the ranks) within floating
point tolerance.

    torchrun --nproc-per-node 2 examples/ddp_train.py [--steps 20] [--fsdp] [--backend gloo]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_lm import VOCAB, TinyLM, batches  # noqa: E402


def make_model(device: torch.device, fsdp: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


def step_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))


def train_distributed(device: torch.device, steps: int, fsdp: bool) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(device, fsdp)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for x, y in batches(steps):
        shard = x.shape[0] // world
        rows = slice(rank * shard, (rank + 1) * shard)
        loss = step_loss(model, x[rows].to(device), y[rows].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses


def train_single(device: torch.device, steps: int, world: int) -> list[float]:
    """One process, the combined batch of all ranks."""
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for x, y in batches(steps):
        rows = slice(0, (x.shape[0] // world) * world)
        loss = step_loss(model, x[rows].to(device), y[rows].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    parser.add_argument(
        "--backend",
        default="cpu:gloo,accel:accl",
        help='process-group backend ("gloo" alone works too: accl joins at the first collective)',
    )
    args = parser.parse_args()

    import torch_accel  # noqa: F401  (torch's autoload imports it too)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("accel", local_rank % torch.accel.device_count())
    torch.accel.set_device(device)
    # With a backend string that names nothing for accel ("gloo"), accl joins the group at its
    # first collective on accel tensors; device_id would make PyTorch ask the group for its accel
    # backend before that, so it is passed only where the string names accel's.
    named = "accel:" in args.backend
    dist.init_process_group(backend=args.backend, device_id=device if named else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    kind = "FSDP2" if args.fsdp else "DDP"

    torch.accel.reset_fallback_stats()
    losses = train_distributed(device, args.steps, args.fsdp)
    fallbacks = torch.accel.fallback_stats()
    ok = not fallbacks
    if fallbacks:
        print(f"rank {rank}: CPU fallback was used: {fallbacks}")
    if rank == 0:
        reference = train_single(device, args.steps, world)
        for step in range(0, args.steps, 5):
            print(
                f"step {step:3d}  loss {kind} {losses[step]:.5f}  one process {reference[step]:.5f}"
            )
        worst = max(abs(a - b) for a, b in zip(losses, reference, strict=True))
        print(f"{kind} on {world} ranks ({device.type}): max |loss difference| {worst:.2e}")
        ok = (
            ok
            and worst <= 1e-4
            and all(math.isfinite(v) for v in losses)
            and losses[-1] < losses[0]
        )
        print("OK" if ok else "FAILED")
    flag = torch.tensor([1.0 if ok else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    return 0 if flag.item() == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
