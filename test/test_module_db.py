"""PyTorch's ModuleInfo database over accel.

For every ModuleInfo of torch.testing._internal.common_modules.module_db and every sample of
module_inputs_func(module_info, device="cpu", dtype=torch.float32, requires_grad=..., training=...)
the module is built on the CPU (seeded), deep-copied and moved with .to("accel"), and both run the
same inputs. Modes:

* train: module.train(), samples made with training=True; forward, then backward with a fixed
  seeded grad_output per differentiable output;
* eval: module.eval(), samples made with training=False; forward and backward as train;
* no_grad: module.eval() under torch.no_grad(), samples made with training=True (they include
  the fast-path samples, which torch's tests run this way) and without requires_grad; forward
  only. This is where nn.Transformer*'s and nn.MultiheadAttention's fast paths run.

Compared (torch.testing.assert_close, default float32 tolerances): the outputs, the gradients of
the inputs and of the parameters, and the buffers after the forward (running statistics).

* The sweep runs with the CPU fallback forbidden (ACCEL_FALLBACK=error): a sample that needs it
  fails, and counts as "fell back" with the operators it named.
* Random samples (a module in training mode with a dropout submodule or a dropout argument
  above 0, RReLU, fractional max pooling without _random_samples) are compared by types, dtypes
  and shapes only: accel's generator does not draw the CPU's numbers, so no seed makes the masks
  agree.
* Lazy modules: a first forward under no_grad materializes the parameters on each device (accel
  draws its own initial values), the accel parameters must then be materialized on accel with
  the CPU's shapes; the CPU's values are loaded into them and the sample runs as any other.
* The CPU module is cast with .to(torch.float32) before the copy, as torch's own module tests
  do (FractionalMaxPool's sample functions register float64 _random_samples buffers).
* A sample whose construction or CPU run raises is skipped (not the backend's to run).

Every ModuleInfo runs by default (about 2800 samples in 15-30 s on 2 cores, so make test runs
them all); MODULE_DB_MODULES=nn.Linear,nn.LSTM runs the named ones only. A known failure that
passes (xpass) fails its test. test_summary prints the totals and the modules that failed, and
writes the counts of every module (samples run, matched, failed, fell back, skipped) with every
failure to build/module_db_summary.json.

Known failures are in module_db_known_failures.yaml, by ModuleInfo name and mode, each with its
reason; only failures that are not defects of the backend belong there.

The modules run in a worker process (this file run as a script), one at a time, so that a crash,
a hang or a device left unusable does not take the suite with it; the worker is started again
(sweep_worker.py).
"""

from __future__ import annotations

import copy
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils import _pytree as pytree

import sweep_worker as sweep

KNOWN_FAILURES_FILE = Path(__file__).with_name("module_db_known_failures.yaml")
ONLY = [n for n in os.environ.get("MODULE_DB_MODULES", "").split(",") if n]
MODES = ("train", "eval", "no_grad")
ACCEL = torch.device("accel")
# A sample that runs longer than this is taken for a hang: the worker is killed.
HANG_SECONDS = 120.0

# Tolerances other than assert_close's float32 defaults, by module. ConvTranspose3d's weight
# gradient (oneDNN on the CPU) splits its reduction by the number of OpenMP threads, so the CPU
# reference itself changes with torch.set_num_threads: accel runs the same kernel on a stream
# worker, serially for small tensors (csrc/aten/underlying_task.cpp, SerialScope), and matches
# the CPU at one thread exactly; the CPU on 2 threads differs by ~5e-6 relative.
_REDUCTION_ORDER = {"rtol": 1e-5, "atol": 1e-4}
TOLERANCES: dict[str, dict[str, float]] = {
    "nn.ConvTranspose3d": _REDUCTION_ORDER,
    "nn.LazyConvTranspose3d": _REDUCTION_ORDER,
}
_FALLBACK_ERROR = re.compile(r"(\S+) has no accel kernel, and ACCEL_FALLBACK=error forbids")


# --- module_db and the known failures ----------------------------------------------------------


def _load_module_db() -> dict[str, Any]:
    """{name: ModuleInfo}."""
    return {info.name: info for info in sweep.import_testing_db("common_modules", "module_db")}


# --- one sample --------------------------------------------------------------------------------


class Skip(Exception):
    """The CPU cannot build or run the sample: nothing to compare."""


def to_accel(x: Any, memo: dict[int, torch.Tensor]) -> Any:
    """A forward argument on accel: tensors become accel leaves (requires_grad kept), so that
    their gradients can be compared with the CPU's; a tensor passed twice (KLDivLoss's scalar
    samples pass one tensor as input and target) stays one tensor; a PackedSequence keeps its
    batch_sizes on the CPU."""
    if isinstance(x, torch.Tensor):
        if id(x) not in memo:
            memo[id(x)] = x.detach().to(ACCEL).requires_grad_(x.requires_grad)
        return memo[id(x)]
    if isinstance(x, PackedSequence):
        data, sorted_indices, unsorted_indices = (
            to_accel(v, memo) for v in (x.data, x.sorted_indices, x.unsorted_indices)
        )
        return PackedSequence(data, x.batch_sizes, sorted_indices, unsorted_indices)
    if isinstance(x, (list, tuple)):
        values = [to_accel(v, memo) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else type(x)(values)
    if isinstance(x, dict):
        return {k: to_accel(v, memo) for k, v in x.items()}
    return x


def is_random(module: nn.Module) -> bool:
    """Whether the module's forward draws random numbers (in its current mode)."""
    for m in module.modules():
        if isinstance(m, (nn.FractionalMaxPool2d, nn.FractionalMaxPool3d)):
            if m._random_samples is None:
                return True
        if not m.training:
            continue
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        if isinstance(m, (nn.MultiheadAttention, nn.RNNBase)) and m.dropout > 0:
            return True
        if isinstance(m, nn.RReLU):
            return True
    return False


def compare(
    actual: Any, expected: Any, values: bool, path: str, tol: dict[str, float] | None = None
) -> None:
    """Raises Mismatch where the accel result differs from the CPU one; values=False compares
    types, dtypes and shapes only; tol: rtol and atol for assert_close."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise sweep.Mismatch(f"{path}: {type(actual).__name__}, CPU a tensor")
        on_cpu = path.endswith(".batch_sizes")  # a PackedSequence's, on the CPU on every device
        if not on_cpu and actual.device.type != "accel":
            raise sweep.Mismatch(f"{path}: on {actual.device}, expected accel")
        if (actual.dtype, actual.shape) != (expected.dtype, expected.shape):
            raise sweep.Mismatch(
                f"{path}: {actual.dtype}{list(actual.shape)}, CPU {expected.dtype}"
                f"{list(expected.shape)}"
            )
        if values:
            try:
                torch.testing.assert_close(
                    actual.detach().cpu(),
                    expected.detach(),
                    equal_nan=True,
                    check_device=False,
                    **(tol or {}),
                )
            except AssertionError as e:
                raise sweep.Mismatch(f"{path}: {e}") from None
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise sweep.Mismatch(f"{path}: {type(actual).__name__}, CPU {type(expected).__name__}")
        names = getattr(expected, "_fields", range(len(expected)))
        for n, a, e in zip(names, actual, expected, strict=True):
            compare(a, e, values and n != "batch_sizes", f"{path}.{n}", tol)
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise sweep.Mismatch(f"{path}: {actual!r:.100}, CPU {expected!r:.100}")
        for k in expected:
            compare(actual[k], expected[k], values, f"{path}[{k!r}]", tol)
    elif type(actual) is not type(expected) or (values and actual != expected):
        raise sweep.Mismatch(f"{path}: {actual!r:.100}, CPU {expected!r:.100}")


@dataclass
class Run:
    """One run of a module on one device: its outputs, gradients and buffers afterwards."""

    outputs: Any
    grads: dict[str, torch.Tensor | None]
    buffers: dict[str, torch.Tensor]


def run(module: nn.Module, args: Any, kwargs: Any, grad_outputs: list[torch.Tensor] | None) -> Run:
    """Forward, then (where anything requires grad) backward with grad_outputs, or fixed seeded
    ones (then stored in grad_outputs)."""
    out = module(*args, **kwargs)
    outputs = [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    inputs = [t for t in _flat((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    names = [f"input{i}" for i in range(len(inputs))]
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    leaves = inputs + [p for _, p in params]
    names += [n for n, _ in params]
    grads: dict[str, torch.Tensor | None] = {}
    if outputs and leaves:
        if grad_outputs is None:
            raise AssertionError("no grad_outputs")
        if not grad_outputs:
            gen = torch.Generator().manual_seed(0)
            grad_outputs += [torch.randn(o.shape, generator=gen) for o in outputs]
        gs = [g.to(o.device) for g, o in zip(grad_outputs, outputs, strict=True)]
        values = torch.autograd.grad(outputs, leaves, gs, allow_unused=True)
        grads = dict(zip(names, values, strict=True))
    return Run(out, grads, dict(module.named_buffers()))


def _flat(x: Any) -> list[Any]:
    """Leaves of forward arguments; of a PackedSequence, its data."""
    leaves = pytree.tree_leaves(x, is_leaf=lambda v: isinstance(v, PackedSequence))
    return [v.data if isinstance(v, PackedSequence) else v for v in leaves]


def check_sample(info: Any, sample: Any, mode: str, index: int) -> bool:
    """Runs one sample on the CPU and on accel; raises Skip, or what went wrong on accel.
    Returns whether the sample is random (compared by shapes only)."""
    ctor, fwd = sample.constructor_input, sample.forward_input
    try:
        torch.manual_seed(index)
        cpu = info.module_cls(*ctor.args, **ctor.kwargs)
        cpu.train(mode == "train")
        cpu.to(torch.float32)  # as torch's own tests: FractionalMaxPool's buffers come float64
        dev = copy.deepcopy(cpu)
    except Exception as e:  # noqa: BLE001 (the CPU refuses it: not ours to test)
        raise Skip(f"construction: {e}") from None
    if fwd is None:
        raise Skip("no forward input")
    dev.to(ACCEL)
    random = is_random(cpu)
    memo: dict[int, torch.Tensor] = {}
    args, kwargs = to_accel(fwd.args, memo), to_accel(fwd.kwargs, memo)
    grad_outputs: list[torch.Tensor] | None = None if mode == "no_grad" else []
    with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
        lazy = any(nn.parameter.is_lazy(t) for t in [*cpu.parameters(), *cpu.buffers()])
        try:
            if lazy:
                with torch.no_grad():
                    cpu(*fwd.args, **fwd.kwargs)
            expected = run(cpu, fwd.args, fwd.kwargs, grad_outputs)
        except Exception as e:  # noqa: BLE001 (the CPU refuses it: not ours to test)
            raise Skip(f"CPU run: {e}") from None
        if lazy:
            with torch.no_grad():
                dev(*args, **kwargs)
            for n, t in [*dev.named_parameters(), *dev.named_buffers()]:
                if nn.parameter.is_lazy(t) or t.device.type != "accel":
                    raise sweep.Mismatch(f"lazy module's {n}: {type(t).__name__} on {t.device}")
            dev.load_state_dict(cpu.state_dict())
        actual = run(dev, args, kwargs, grad_outputs)
        torch.accel.synchronize()
    tol = TOLERANCES.get(info.name)
    compare(actual.outputs, expected.outputs, not random, "output", tol)
    compare(actual.grads, expected.grads, not random, "grad", tol)
    compare(actual.buffers, expected.buffers, not random, "buffer", tol)
    return random


# --- one module, in the worker -----------------------------------------------------------------


@dataclass
class ModuleResult(sweep.ModeResult):
    """A mode's samples (skipped: the CPU refused the sample)."""

    fell_back: dict[int, list[str]] = field(default_factory=dict)  # failed for a CPU fallback
    random: int = 0  # matched samples compared by shapes only


ModuleReport = sweep.Report[ModuleResult]


def _describe(sample: Any) -> str:
    ctor = sample.constructor_input
    text = f"{sample.desc or '-'}: ctor(args={ctor.args!r:.100}, kwargs={ctor.kwargs!r:.160})"
    return text.replace("\n", " ")


def check_module(info: Any, progress: sweep.Progress) -> ModuleReport:
    report = ModuleReport(info.name)
    start = time.perf_counter()
    for mode in MODES:
        result = report.modes[mode] = ModuleResult()
        torch.manual_seed(0)
        samples = info.module_inputs_func(
            info,
            device="cpu",
            dtype=torch.float32,
            requires_grad=mode != "no_grad",
            training=mode != "eval",  # no_grad: the fast-path samples come with training=True
        )
        for index, sample in enumerate(samples):
            progress(mode, index)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    random = check_sample(info, sample, mode, index)
            except Skip:
                result.skipped += 1
                continue
            except Exception as e:  # noqa: BLE001 (the CPU ran it: a failure of accel)
                result.failed[index] = f"{_describe(sample)}\n    {sweep.error_text(e)}"
                ops = sorted(set(_FALLBACK_ERROR.findall(str(e))))
                if ops:
                    result.fell_back[index] = ops
                if not sweep.device_usable():
                    report.note = f"the device was unusable after {mode} sample {index}"
                    report.seconds = time.perf_counter() - start
                    return report
                continue
            result.matched.append(index)
            result.random += random
    report.seconds = time.perf_counter() - start
    return report


# --- the tests ---------------------------------------------------------------------------------

_REPORTS: dict[str, ModuleReport] = {}
_WORKER: sweep.Worker[ModuleResult] | None = None


def _shared_worker() -> sweep.Worker[ModuleResult]:
    """The worker, started when the tests are collected: it lists the ModuleInfo names (the
    parent does not import torch's testing utilities: their import changes global state)."""
    global _WORKER
    if _WORKER is None:
        argv = [__file__, "--worker"]
        _WORKER = sweep.Worker(argv, ModuleResult, "ModuleInfo", MODES[0], HANG_SECONDS)
    return _WORKER


def _selected_modules() -> list[str]:
    if __name__ == "__main__":
        return []  # the worker: it imports no pytest test
    return ONLY or _shared_worker().names()


def load_module_db_known_failures() -> sweep.KnownFailures:
    """{ModuleInfo name: {mode: Known}} from module_db_known_failures.yaml."""
    return sweep.load_known_failures(KNOWN_FAILURES_FILE, MODES)


@pytest.fixture(scope="module")
def known_failures() -> sweep.KnownFailures:
    return load_module_db_known_failures()


@pytest.fixture(scope="module")
def worker() -> Iterator[sweep.Worker[ModuleResult]]:
    with _shared_worker() as w:
        yield w


def test_known_failures_file(worker: sweep.Worker[ModuleResult]) -> None:
    missing = worker.unknown(load_module_db_known_failures())
    assert not missing, f"not ModuleInfo names: {missing}"


@pytest.mark.parametrize("name", _selected_modules())
def test_module(
    name: str, worker: sweep.Worker[ModuleResult], known_failures: sweep.KnownFailures
) -> None:
    sweep.check_entry(worker, name, known_failures, _REPORTS, strict=True)


def summarize(reports: dict[str, ModuleReport], known: sweep.KnownFailures) -> dict[str, Any]:
    keys = ("samples", "matched", "failed", "fell_back", "known", "skipped", "random")
    totals = dict.fromkeys(keys, 0)
    modules: dict[str, dict[str, Any]] = {}
    for name, report in reports.items():
        row = dict.fromkeys(keys, 0)
        row["known"] = sweep.judge(report, known).known
        ops: set[str] = set()
        for res in report.modes.values():
            row["samples"] += res.run
            row["matched"] += len(res.matched)
            row["failed"] += len(res.failed)
            row["fell_back"] += len(res.fell_back)
            row["skipped"] += res.skipped
            row["random"] += res.random
            ops.update(op for v in res.fell_back.values() for op in v)
        for k in keys:
            totals[k] += row[k]
        modules[name] = {
            **row,
            "fallback_ops": sorted(ops),
            "seconds": round(report.seconds, 2),
            "note": report.note,
            "failures": {m: res.failed for m, res in report.modes.items() if res.failed},
        }
    seconds = round(sum(r.seconds for r in reports.values()), 1)
    return {"modules": len(reports), "totals": totals, "seconds": seconds, "by_module": modules}


def _print_summary(summary: dict[str, Any]) -> None:
    t = summary["totals"]
    print(
        f"\nModuleInfo over accel: {summary['modules']} modules, {t['samples']} samples run, "
        f"{t['matched']} matched ({t['random']} of them random: shapes only), {t['failed']} "
        f"failed ({t['known']} known, {t['fell_back']} fell back), {t['skipped']} skipped, "
        f"{summary['seconds']} s in the worker"
    )
    rows = {n: r for n, r in summary["by_module"].items() if ONLY or r["failed"]}
    if rows:
        print(f"  {'module':32} {'run':>5} {'match':>5} {'fail':>5} {'fb':>4}  fallback ops")
    for name, row in rows.items():
        ops = ", ".join(row["fallback_ops"])
        print(
            f"  {name:32} {row['samples']:5} {row['matched']:5} {row['failed']:5} "
            f"{row['fell_back']:4}  {ops}"
        )


def test_summary(known_failures: sweep.KnownFailures, capsys: pytest.CaptureFixture[str]) -> None:
    if not _REPORTS:
        pytest.skip("no module ran")
    summary = summarize(_REPORTS, known_failures)
    sweep.report_summary(summary, _print_summary, capsys, "module_db_summary.json")


def worker_main() -> None:
    """The worker: checks the ModuleInfos the parent names (sweep_worker.serve)."""
    sweep.serve(_load_module_db, check_module, "error")


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker_main()
