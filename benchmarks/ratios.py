"""What the benchmarks share: timing, processes that time one device each, and the table of
ratios against goals they print and write as JSON."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def synchronize(device: str) -> None:
    """Waits for ``device``: "accel", "cuda", "both", or anything else (the CPU: nothing)."""
    if device in ("accel", "both"):
        torch.accel.synchronize()
    if device in ("cuda", "both"):
        torch.cuda.synchronize()


def best_of(fn: Callable[[], object], repeats: int, device: str = "accel") -> float:
    """The shortest of ``repeats`` timed calls of ``fn``, with ``device`` synchronized around
    each (see synchronize)."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved(
    first: Callable[[], object], second: Callable[[], object], rounds: int, device: str = "accel"
) -> tuple[float, float]:
    """The shortest timed call of each of two functions, timed in alternation (``rounds`` calls
    each), so that a machine whose speed drifts (shared cores) slows both alike."""
    a, b = [], []
    for _ in range(rounds):
        a.append(best_of(first, 1, device))
        b.append(best_of(second, 1, device))
    return min(a), min(b)


# A case run apart: make(device) returns the call to time on that device.
Make = Callable[[str], Callable[[], object]]


def serve(cases: dict[str, Make], device: str) -> None:
    """The loop of a side's process (see Side): for each case name read from stdin, the case's
    set-up and first calls (answered with null), then one timed call per later request
    (answered with its seconds); a failure is answered with its message."""
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    calls: dict[str, Callable[[], object]] = {}
    for line in sys.stdin:
        name = line.strip()
        try:
            if name not in calls:
                calls[name] = cases[name](device)
                best_of(calls[name], 1, device)
                answer: object = None
            else:
                answer = best_of(calls[name], 1, device)
        except Exception as e:  # noqa: BLE001 - the parent reports it, and the other cases run
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


class Side:
    """One device's process, running ``script --side <device>`` (which calls serve): the CPU
    and accel sides of a comparison run apart, since in one process the CPU's kernels would pay
    for accel's stream worker (two OpenMP teams: libgomp throttles their threads' spinning once
    they outnumber the cores, and every parallel region then wakes sleeping threads)."""

    def __init__(self, script: str, device: str) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, script, "--side", device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, name: str) -> float | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the side's process ended (exit status {self.proc.wait()})")
        answer = json.loads(line)
        if isinstance(answer, dict):
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def apart(name: str, sides: dict[str, Side], rounds: int) -> dict[str, float]:
    """Per side, the shortest of ``rounds`` timed calls of case ``name``, the sides called in
    alternation (so that a machine whose speed drifts slows both alike), after one set-up call
    each."""
    for side in sides.values():
        side.ask(name)
    times: dict[str, list[float]] = {device: [] for device in sides}
    for _ in range(rounds):
        for device, side in sides.items():
            times[device].append(side.ask(name))
    return {device: min(t) for device, t in times.items()}


def against_cpu(
    names: list[str], sides: dict[str, Side], rounds: int
) -> Callable[[], tuple[float, float]]:
    """A case for report: the summed times of the cases ``names`` on the "cpu" and "accel"
    sides (see apart)."""

    def case() -> tuple[float, float]:
        best = [apart(name, sides, rounds) for name in names]
        return sum(b["cpu"] for b in best), sum(b["accel"] for b in best)

    return case


def report(
    description: str,
    default_json: Path,
    cases: Sequence[tuple[str, Callable[[], tuple[float, float]]]],
    goals: dict[str, float],
    labels: tuple[str, str, str],
) -> int:
    """Runs each case (returning the times of the baseline and of the measured side), prints
    ``baseline / measured`` against its goal, and writes the results as JSON (``--json``).
    ``labels``: the names of the baseline, the measured side and the ratio. A case that fails is
    reported and the others still run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--json", type=Path, default=default_json)
    parser.add_argument("cases", nargs="*", help="run only these cases (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.cases) - {name for name, _ in cases})
    if unknown:
        parser.error(f"no such case: {', '.join(unknown)}")
    if args.cases:
        cases = [(name, fn) for name, fn in cases if name in args.cases]
    base_label, measured_label, ratio_label = labels
    width = max(len(name) for name, _ in cases) + 1
    print(f"torch {torch.__version__}, accel driver {torch.accel.get_device_properties().driver}")
    print(f"{'case':<{width}} {base_label + ' ms':>10} {measured_label + ' ms':>10} "
          f"{ratio_label:>8} {'goal':>6}")  # fmt: skip
    results: dict[str, dict[str, object]] = {}
    for name, fn in cases:
        goal = goals[name]
        try:
            base, measured = fn()
        except Exception as e:  # noqa: BLE001 - reported, and the other cases still run
            reason = str(e).strip().splitlines()[0][:120]
            print(f"{name:<{width}} not measured: {type(e).__name__}: {reason}")
            results[name] = {"error": f"{type(e).__name__}: {reason}", "goal": goal}
            continue
        ratio = base / measured
        verdict = "ok" if ratio >= goal else "below"
        print(f"{name:<{width}} {base * 1e3:10.3f} {measured * 1e3:10.3f} {ratio:7.2f}x "
              f"{goal:5.2f}x {verdict}")  # fmt: skip
        results[name] = {
            f"{base_label}_s": base,
            f"{measured_label}_s": measured,
            ratio_label: ratio,
            "goal": goal,
        }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0
