"""Sending accel tensors to another process: accel's IPC (no copy) against the CPU's way.

A spawned child receives tensors through a torch.multiprocessing queue and answers with one
value it read from each. accel: the tensor is created on accel and shared without a copy (the
child maps the same device memory). cpu: what a backend without IPC leaves users with, the tensor
moved to the CPU (shared memory), sent, and moved to accel in the child. Both in the same run, a
warm-up round first; the ratio is the cpu way's time over accel's (higher is better, goal >= 1
from 1 MiB up: sharing must not lose to copying).

    python benchmarks/ipc.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.multiprocessing as mp

SIZES_MIB = (1, 16, 128)
ROUNDS = 5


def _child(inbox, outbox) -> None:
    while (msg := inbox.get()) is not None:
        how, t = msg
        if how == "cpu":
            t = t.to("accel")
        value = float(t[-1].item())
        del t, msg  # released before the answer: the sender may reuse the memory at once
        outbox.put(value)


def _round_trip(inbox, outbox, how: str, mib: int) -> float:
    n = mib * (1 << 20) // 4
    x = torch.full((n,), 1.0, device="accel")
    torch.accel.synchronize()
    start = time.perf_counter()
    inbox.put((how, x if how == "accel" else x.cpu()))
    value = outbox.get(timeout=300)
    elapsed = time.perf_counter() - start
    assert value == 1.0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(inbox, outbox))
    child.start()
    _round_trip(inbox, outbox, "accel", 1)  # warm-up: the child's start and first import
    _round_trip(inbox, outbox, "cpu", 1)
    rows = []
    print(f"torch {torch.__version__}: a tensor to a spawned process and one value back (ms)")
    print(f"{'size':>8} {'accel ipc':>10} {'via cpu':>10} {'ratio':>7}  goal >= 1")
    for mib in SIZES_MIB:
        accel = min(_round_trip(inbox, outbox, "accel", mib) for _ in range(ROUNDS)) * 1e3
        cpu = min(_round_trip(inbox, outbox, "cpu", mib) for _ in range(ROUNDS)) * 1e3
        ratio = cpu / accel
        verdict = "ok" if ratio >= 1 else "MISS"
        print(f"{mib:>5} MiB {accel:>10.2f} {cpu:>10.2f} {ratio:>6.2f}x  {verdict}")
        rows.append({"mib": mib, "accel_ms": accel, "cpu_ms": cpu, "ratio": ratio})
    inbox.put(None)
    child.join()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
