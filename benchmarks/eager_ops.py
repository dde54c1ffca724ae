"""Eager operator speed on accel against native PyTorch on the CPU, measured in the same run.

Three sides run the same operators, each in its own process (two OpenMP thread teams in one
process, the caller's and the stream worker's, slow each other down on a small machine):

  cpu       native PyTorch on CPU tensors
  accel     accel tensors (native and underlying kernels, in stream order)
  fallback  accel tensors with every underlying operator forced through the copying CPU fallback

Tiny tensors measure per-call latency (goal: accel at most 1.5x the CPU's); large tensors
measure throughput (goal: accel at least 0.9x the CPU's). First calls (no goal) measure tiny
calls whose signature is new each time (shapes that keep changing, as a growing KV cache's):
accel runs the first call of each signature synchronously, after a meta pass (README,
Operators). Prints a table of ratios and writes JSON (default benchmarks/results/eager_ops.json).

    python benchmarks/eager_ops.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

LATENCY_GOAL = 1.5  # accel time / cpu time, tiny ops
THROUGHPUT_GOAL = 0.9  # cpu time / accel time, large ops


def cases(device: str) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    a, b = rand(8, 8), rand(8, 8)
    idx = torch.tensor([0, 2, 4, 6]).to(device)
    tiny = {
        "add": lambda: a + b,
        "mul": lambda: a * b,
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(),
        "mm 8x8": lambda: a @ b,
        "cat": lambda: torch.cat([a, b]),
        "index_select": lambda: a.index_select(0, idx),
        "softmax": lambda: torch.softmax(a, -1),
    }
    v1, v2 = rand(1 << 24), rand(1 << 24)
    m1, m2 = rand(1024, 1024), rand(1024, 1024)
    s = rand(4096, 4096)
    w, bias = rand(4096), rand(4096)
    img, kernel = rand(8, 64, 56, 56), rand(64, 64, 3, 3)
    large = {
        "add 16M": lambda: v1 + v2,
        "gelu 16M": lambda: F.gelu(v1),
        "mm 1024": lambda: m1 @ m2,
        "softmax 4096^2": lambda: torch.softmax(s, -1),
        "layer_norm 4096^2": lambda: F.layer_norm(s, (4096,), w, bias),
        "conv2d 8x64x56x56 k3": lambda: F.conv2d(img, kernel, padding=1),
    }
    return tiny, large


def measure(fn: Callable[[], object], sync: Callable[[], None], calls: int, repeats: int) -> float:
    """The best over `repeats` of the mean seconds per call over `calls` back-to-back calls
    (the minimum is the least disturbed by the rest of the machine)."""
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return min(samples)


def first_calls(device: str, sync: Callable[[], None], quick: bool) -> float:
    """Seconds per add of two slices whose length is new at every call (the best of the
    repeats, each over lengths no earlier call used)."""
    import torch

    calls, repeats = (300, 3) if quick else (2000, 5)
    a = torch.randn(calls * (repeats + 1)).to(device)
    b = torch.randn(calls * (repeats + 1)).to(device)
    samples = []
    for r in range(repeats):
        start = time.perf_counter()
        for n in range(r * calls + 1, (r + 1) * calls + 1):
            a[:n] + b[:n]
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return min(samples)


def run_side(side: str, quick: bool) -> dict[str, dict[str, float]]:
    import torch

    device = "cpu" if side == "cpu" else "accel"
    if side == "fallback":
        import torch_accel

        torch_accel._C._set_fallback_mode("silent")
        torch_accel._C._set_force_fallback(True)
    sync = torch.accel.synchronize if device == "accel" else (lambda: None)
    tiny, large = cases(device)
    # Warm-up: first calls (caches, threads started at import) do not count.
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        for fn in tiny.values():
            fn()
    sync()
    out: dict[str, dict[str, float]] = {"tiny": {}, "large": {}, "first": {}}
    for name, fn in tiny.items():
        out["tiny"][name] = measure(fn, sync, 200 if quick else 2000, 3 if quick else 7)
    out["first"]["add, new shape each call"] = first_calls(device, sync, quick)
    for name, fn in large.items():
        out["large"][name] = measure(fn, sync, 2 if quick else 5, 2 if quick else 5)
    return out


def table(results: dict, kind: str, title: str, scale: float, goal: float | None) -> list[dict]:
    """Prints one table; latency ratios are accel/cpu, throughput ratios cpu/accel."""
    latency = kind != "large"
    print(f"\n{title}")
    head = f"{'op':<26}{'cpu':>9}{'accel':>9}{'ratio':>8}{'fallback':>10}{'ratio':>8}"
    print(f"{head}  goal {'<=' if latency else '>='} {goal}" if goal else head)
    rows = []
    for name, cpu in results["cpu"][kind].items():
        acc, fb = results["accel"][kind][name], results["fallback"][kind][name]
        ratio, fb_ratio = (acc / cpu, fb / cpu) if latency else (cpu / acc, cpu / fb)
        met = None if goal is None else ratio <= goal if latency else ratio >= goal
        times = f"{cpu * scale:9.2f}{acc * scale:9.2f}{ratio:8.2f}{fb * scale:10.2f}{fb_ratio:8.2f}"
        verdict = "" if met is None else "  ok" if met else "  MISSED"
        print(f"{name:<26}{times}{verdict}")
        rows.append({"kind": kind, "op": name, "cpu_s": cpu, "accel_s": acc,
                     "fallback_s": fb, "accel_ratio": ratio, "fallback_ratio": fb_ratio,
                     "goal": goal, "met": met})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", default=str(Path(__file__).parent / "results" / "eager_ops.json"))
    parser.add_argument("--side", choices=["cpu", "accel", "fallback"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        print(json.dumps(run_side(args.side, args.quick)))
        return 0

    results = {}
    for side in ("cpu", "accel", "fallback"):
        cmd = [sys.executable, __file__, "--side", side] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return 1
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])

    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    rows = table(
        results,
        "tiny",
        "tiny tensors: microseconds per call (lower is better); ratio = accel / cpu",
        scale=1e6,
        goal=LATENCY_GOAL,
    )
    rows += table(
        results,
        "first",
        "first calls of a signature: microseconds per call (no goal); ratio = accel / cpu",
        scale=1e6,
        goal=None,
    )
    rows += table(
        results,
        "large",
        "large tensors: milliseconds per call; ratio = cpu / accel throughput (higher is better)",
        scale=1e3,
        goal=THROUGHPUT_GOAL,
    )

    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"torch": torch.__version__, "cpus": os.cpu_count(),
                                "rows": rows}, indent=1))  # fmt: skip
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
