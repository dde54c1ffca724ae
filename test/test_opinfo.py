"""PyTorch's OpInfo database over accel.

Every sample input of an OpInfo (op_db in torch.testing._internal.common_methods_invocations)
whose CPU run succeeds is moved to accel (tensors keep their strides and storage offset), run
there, and the accel result is compared with the CPU one. Modes:

* forward: float32 samples; the results, and the samples' tensors afterwards (in-place ops);
* backward: float32 samples with requires_grad, for ops that support autograd: the gradients
  of the inputs for a fixed seeded grad_output per differentiable output;
* bf16: bfloat16 samples;
* bf16_backward: bfloat16 samples with requires_grad, as backward.

The sweep runs with the CPU fallback forbidden (ACCEL_FALLBACK=error): a sample that needs it
fails. OPINFO_FALLBACK=silent allows the fallback instead (to check the fallback's own results);
then the bf16 modes run only for ops whose float32 forward took no fallback (the fallback runs
the CPU kernel itself).

Random operators and operators that return uninitialized memory (empty and the like) are
compared by shape and dtype only. A sample whose CPU run raises is skipped.

By default a curated subset (FAST_OPS: about 100 common ops, 10-20 s) runs with the rest of
the suite; there a known failure that passes fails its test (xpass). OPINFO_FULL=1 sweeps every
OpInfo (make opinfo: about 41000 samples, 1-3 minutes on 2 cores); there an xpass is reported
without failing (OPINFO_STRICT=1: fails). OPINFO_OPS=a,b runs the named OpInfos only, and
OPINFO_MAX_SAMPLES=n the first n samples of each op and mode only; OPINFO_REFERENCE=1 runs the
OpInfos' reference_inputs instead of their sample_inputs; OPINFO_AGAINST=cuda compares accel
with native CUDA instead of the CPU (the cuda driver on a GPU: test/gpu_proof.sh). test_summary
prints the counts and asserts that at least 98% of the samples match; the full sweep and
OPINFO_OPS also write them, with every failure, to build/opinfo_summary.json.

Known failures are in opinfo_known_failures.yaml, by OpInfo full name (name.variant) and mode,
each with its reason; reasons of bugs in the backend start with "BUG:".

The ops run in a worker process (this file run as a script), one op at a time: some failures
leave the device unusable for the rest of the process, and a crash or a hang must not take the
suite with it. The worker is started again after any of these (sweep_worker.py).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import sweep_worker as sweep
from opinfo_samples import AGAINST, UnsupportedSample, compare, like_cuda, to_accel

KNOWN_FAILURES_FILE = Path(__file__).with_name("opinfo_known_failures.yaml")
FULL = os.environ.get("OPINFO_FULL", "") not in ("", "0")
ONLY = [n for n in os.environ.get("OPINFO_OPS", "").split(",") if n]
# reference_inputs instead of sample_inputs: more samples (extremal values, noncontiguous
# tensors), about 1.7 times as many; they begin with the sample_inputs.
REFERENCE = os.environ.get("OPINFO_REFERENCE", "") not in ("", "0")
STRICT = not (FULL or ONLY) or os.environ.get("OPINFO_STRICT", "") not in ("", "0")
MAX_SAMPLES = int(os.environ.get("OPINFO_MAX_SAMPLES", 0)) or 1_000_000
TARGET = 0.98
MODES = ("forward", "backward", "bf16", "bf16_backward")
# How the worker treats operators without an accel kernel: "error" (ACCEL_FALLBACK=error) or
# "silent" (the copying fallback runs them).
FALLBACK = os.environ.get("OPINFO_FALLBACK", "error")
assert FALLBACK in ("error", "silent"), f"OPINFO_FALLBACK={FALLBACK!r}: use error or silent"
if AGAINST == "cuda" and __name__ != "__main__" and not torch.cuda.is_available():
    pytest.skip(
        "OPINFO_AGAINST=cuda compares with native CUDA: no GPU here", allow_module_level=True
    )
# A sample that runs longer than this is taken for a hang: the worker is killed.
HANG_SECONDS = 120.0 if (FULL or ONLY) else 30.0

# The subset that runs in `make test`: common operators of every family, fast ones.
FAST_OPS = """
    abs neg exp log sqrt rsqrt sigmoid tanh sin erf floor sign nan_to_num clamp
    add sub mul div.no_rounding_mode pow maximum eq lt where lerp addcmul
    nn.functional.relu nn.functional.gelu nn.functional.silu nn.functional.leaky_relu
    nn.functional.hardtanh nn.functional.softplus softmax log_softmax
    sum mean amax argmax var std norm cumsum logsumexp max.reduction_with_dim sort topk
    mm bmm matmul addmm einsum nn.functional.linear linalg.vector_norm
    nn.functional.conv2d nn.functional.max_pool2d nn.functional.avg_pool2d
    nn.functional.adaptive_avg_pool2d nn.functional.batch_norm nn.functional.layer_norm
    nn.functional.group_norm nn.functional.embedding nn.functional.dropout
    nn.functional.cross_entropy nn.functional.mse_loss nn.functional.scaled_dot_product_attention
    nn.functional.pad.constant nn.functional.interpolate.nearest
    cat stack reshape permute transpose expand flatten split chunk narrow index_select gather
    scatter_add index_put masked_fill masked_select nonzero tril flip roll repeat unique
    to clone contiguous
    arange linspace zeros_like full empty randn_like bernoulli multinomial
""".split()

# Random operators, compared by shape and dtype (accel's generator is not the CPU's).
_RANDOM = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "normal.in_place",
    "normal.number_mean",
    "uniform",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "nn.functional.alpha_dropout",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu",
    "pca_lowrank",  # random projections
    "svd_lowrank",
}
# Operators whose results are uninitialized memory, compared by shape and dtype.
_UNINITIALIZED_PARTS = ("empty",)


# Samples that are random: dropout in attention.
_RANDOM_SAMPLES: dict[str, Callable[[Any], bool]] = {
    "nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0.0) > 0,
    "nn.functional.multi_head_attention_forward": lambda s: bool(s.kwargs.get("training")),
}
# Arguments that stay on the CPU (PyTorch wants them there): positions in the sample's args.
_CPU_ARGS = {"tensor_split": (0,)}
# OpInfos whose half-precision ATen kernels accel runs in float32 on purpose, as CUDA's kernels
# compute (yaml/accel_functions.yaml, widen; README, Operators): where the CPU's own half kernel
# computes in half precision its result is not the reference. Their bf16 modes compare with
# the CPU run on the sample upcast to float32, rounded back to bfloat16 (for the samples the
# predicate selects).
_IN_FLOAT: dict[str, Callable[[Any], bool]] = {
    "grid_sampler_2d": lambda s: True,
    "grid_sampler_3d": lambda s: True,
    "nn.functional.grid_sample": lambda s: True,
    "nn.functional.adaptive_avg_pool3d": lambda s: True,
    # its 3-d samples run adaptive_avg_pool3d (the 1-d and 2-d ones are the CPU's on accel too)
    "nn.functional.interpolate.area": lambda s: s.input.dim() == 5,
}


def is_random(op: Any) -> bool:
    return op.full_name in _RANDOM


def values_are_defined(op: Any) -> bool:
    return not is_random(op) and not any(part in op.name for part in _UNINITIALIZED_PARTS)


# --- op_db and the known failures --------------------------------------------------------------


_OP_DB: dict[str, Any] | None = None


def op_db() -> dict[str, Any]:
    global _OP_DB
    if _OP_DB is None:
        ops = sweep.import_testing_db("common_methods_invocations", "op_db")
        _OP_DB = {op.full_name: op for op in ops}
    return _OP_DB


def _applies(where: str, entry: dict[str, Any]) -> bool:
    """Whether a known failure applies: one of a reference input only needs OPINFO_REFERENCE."""
    assert entry.get("inputs", "reference") == "reference", f"{where}: inputs"
    return REFERENCE or entry.get("inputs") != "reference"


def load_opinfo_known_failures() -> sweep.KnownFailures:
    """{OpInfo full name: {mode: Known}} from opinfo_known_failures.yaml."""
    keys = frozenset({"reason", "samples", "inputs"})
    return sweep.load_known_failures(KNOWN_FAILURES_FILE, MODES, keys, _applies)


# --- running samples (in the worker) -----------------------------------------------------------


@dataclass
class OpResult(sweep.ModeResult):
    """A mode's samples (skipped: the CPU raised, or the sample has no accel form)."""

    fallback_ops: list[str] = field(default_factory=list)


OpReport = sweep.Report[OpResult]


class DeviceUnusable(Exception):
    """The device fails every call after the sample's failure: the rest of the op cannot run."""


@dataclass
class Sample:
    input: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def flat(self) -> list[Any]:
        return pytree.tree_leaves((self.input, self.args, self.kwargs))

    def grad_leaves(self) -> list[torch.Tensor]:
        return [t for t in self.flat() if isinstance(t, torch.Tensor) and t.requires_grad]


def _forward(op: Any, s: Sample, random: bool) -> Any:
    if random:
        torch.manual_seed(0)
        torch.accel.manual_seed(0)
    return op(s.input, *s.args, **s.kwargs)


def _backward(
    op: Any,
    s: Sample,
    process: Callable[[Any], Any],
    grads: list[Any] | None,
    grad_dtype: torch.dtype | None = None,
) -> Any:
    """(grad_outputs, gradients of the sample's requires_grad tensors), or None when nothing is
    differentiable. grads: the reference's grad_outputs, None for the reference (seeded normal
    values in the shapes of the outputs, drawn in grad_dtype where given)."""
    out = process(op(s.input, *s.args, **s.kwargs))
    outputs = [
        t
        for t in pytree.tree_leaves(out)
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()
    ]
    leaves = s.grad_leaves()
    if not outputs or not leaves:
        return None
    if grads is None:
        gen = torch.Generator().manual_seed(0)
        grads = [
            torch.randn(o.shape, generator=gen, dtype=grad_dtype or o.dtype).to(o.device, o.dtype)
            for o in outputs
        ]
    else:
        grads = [g.to(o.device, o.dtype) for g, o in zip(grads, outputs, strict=True)]
    return grads, torch.autograd.grad(outputs, leaves, grads, allow_unused=True)


def _upcast(s: Sample) -> Sample:
    """The sample with its half-precision tensors in float32 (leaves as they were)."""

    def up(t: Any) -> Any:
        return t.detach().float().requires_grad_(t.requires_grad) if _is_half(t) else t

    return Sample(*pytree.tree_map(up, (s.input, s.args, s.kwargs)))


def _rounded(x: Any, dtype: torch.dtype) -> Any:
    def down(t: Any) -> Any:
        return t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t

    return pytree.tree_map(down, x)


def _describe(sample: Any) -> str:
    try:
        text = sample.summary()
    except Exception:  # noqa: BLE001 (a description only)
        text = "?"
    return text if len(text) <= 300 else text[:300] + "..."


def _is_half(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16)


def _on_accel(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.device.type == "accel"
    if isinstance(x, torch.device):
        return x.type == "accel"
    return isinstance(x, str) and x == "accel"


def run_mode(op: Any, mode: str, max_samples: int, progress: Callable[[int], None]) -> OpResult:
    result = OpResult()
    dtype = torch.bfloat16 if mode.startswith("bf16") else torch.float32
    backward = mode.endswith("backward")
    random = is_random(op)
    values = values_are_defined(op) and not (random and backward)
    fallback: set[str] = set()
    torch.manual_seed(0)
    make = op.reference_inputs if REFERENCE else op.sample_inputs
    samples = iter(make("cpu", dtype, requires_grad=backward))
    for index in range(max_samples):
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception:  # noqa: BLE001 (making the CPU samples failed: nothing to compare)
            break
        progress(index)
        failures = len(result.failed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _run_sample(op, sample, index, backward, random, values, result, fallback)
        if len(result.failed) > failures and not sweep.device_usable():
            result.fallback_ops = sorted(fallback)
            raise DeviceUnusable(result)
    result.fallback_ops = sorted(fallback)
    return result


def _run_sample(
    op: Any,
    sample: Any,
    index: int,
    backward: bool,
    random: bool,
    values: bool,
    result: OpResult,
    fallback: set[str],
) -> None:
    cpu = Sample(sample.input, tuple(sample.args), dict(sample.kwargs))
    if op.full_name in _RANDOM_SAMPLES and _RANDOM_SAMPLES[op.full_name](cpu):
        random, values = True, False
    keep = _CPU_ARGS.get(op.full_name, ())
    try:
        args = tuple(a if i in keep else to_accel(a) for i, a in enumerate(cpu.args))
        dev = Sample(to_accel(cpu.input), args, to_accel(cpu.kwargs))
    except UnsupportedSample:
        result.skipped += 1
        return
    except Exception as e:  # noqa: BLE001
        result.failed[index] = f"{_describe(sample)}\n    moving it to accel: {sweep.error_text(e)}"
        return
    if not any(_on_accel(x) for x in dev.flat()):
        result.skipped += 1  # nothing for accel to do (logspace(1, 3) runs on the CPU)
        return
    ref = cpu  # what accel is compared with: the CPU, or the same sample on native CUDA
    if AGAINST == "cuda":
        cuda = torch.device("cuda")
        args = tuple(a if i in keep else to_accel(a, cuda) for i, a in enumerate(cpu.args))
        ref = Sample(to_accel(cpu.input, cuda), args, to_accel(cpu.kwargs, cuda))
    process = sample.output_process_fn_grad
    half = next((t.dtype for t in cpu.flat() if _is_half(t)), None)
    in_float = (
        AGAINST == "cpu"
        and half is not None
        and op.full_name in _IN_FLOAT
        and _IN_FLOAT[op.full_name](cpu)
    )
    if in_float:
        ref = _upcast(cpu)
    # The CPU reference. It may change the sample (in-place ops): compared after the op too.
    try:
        if backward:
            expected = _backward(op, ref, process, None, half if in_float else None)
            if expected is None:
                result.skipped += 1
                return
            if in_float:
                expected = (expected[0], _rounded(expected[1], half))
        else:
            expected = _forward(op, ref, random)
            if in_float:
                expected = _rounded(expected, half)
            if AGAINST == "cpu":
                expected = like_cuda(op.name, ref, expected)
    except Exception:  # noqa: BLE001 (the CPU refuses this sample: not ours to test)
        result.skipped += 1
        return
    torch.accel.reset_fallback_stats()
    try:
        if backward:
            actual = _backward(op, dev, process, expected[0])
            if actual is None:
                raise sweep.Mismatch("no differentiable output on accel")
            actual, expected = actual[1], expected[1]
            # A leaf view of a base that requires grad (made under no_grad by some reference
            # samples) gets no gradient on the CPU; its accel copy is a plain leaf that does.
            odd = [t._base is not None and t._base.requires_grad for t in ref.grad_leaves()]
            actual = [a for a, o in zip(actual, odd, strict=True) if not o]
            expected = [e for e, o in zip(expected, odd, strict=True) if not o]
        else:
            actual = _forward(op, dev, random)
        torch.accel.synchronize()
        fallback.update(torch.accel.fallback_stats())
        compare(actual, expected, values)
        if not backward:
            tensors = [t for t in (cpu if in_float else ref).flat() if isinstance(t, torch.Tensor)]
            after = [t for t in dev.flat() if isinstance(t, torch.Tensor)]
            compare(after, tensors, values, "the sample's tensors after the op", False)
    except Exception as e:  # noqa: BLE001 (the CPU ran it: a failure of accel)
        result.failed[index] = f"{_describe(sample)}\n    {sweep.error_text(e)}"
        return
    result.matched.append(index)


def check_op(op: Any, max_samples: int, progress: sweep.Progress) -> OpReport:
    """Runs an OpInfo's modes; stops at a sample after which the device is unusable."""
    report = OpReport(op.full_name)
    start = time.perf_counter()
    modes = []
    for dtype, forward, backward in (
        (torch.float32, "forward", "backward"),
        (torch.bfloat16, "bf16", "bf16_backward"),
    ):
        if dtype in op.supported_dtypes(AGAINST):
            modes.append(forward)
            if op.supports_autograd and dtype in op.supported_backward_dtypes(AGAINST):
                modes.append(backward)
    for mode in modes:
        fwd = report.modes.get("forward")
        if (
            FALLBACK == "silent"
            and mode.startswith("bf16")
            and (fwd is None or not fwd.run or fwd.fallback_ops)
        ):
            continue  # not native or underlying: the CPU fallback runs the CPU kernel
        try:
            report.modes[mode] = run_mode(op, mode, max_samples, lambda i, m=mode: progress(m, i))
        except DeviceUnusable as e:
            report.modes[mode] = e.args[0]
            report.note = f"the device was unusable after a failing {mode} sample: op stopped"
            break
    report.seconds = time.perf_counter() - start
    return report


# --- the tests ---------------------------------------------------------------------------------

_REPORTS: dict[str, OpReport] = {}


def _selected_ops() -> list[str]:
    if ONLY:
        return ONLY
    if FULL:
        return sorted(op_db())
    return FAST_OPS


@pytest.fixture(scope="module")
def known_failures() -> sweep.KnownFailures:
    return load_opinfo_known_failures()


@pytest.fixture(scope="module")
def worker() -> Iterator[sweep.Worker[OpResult]]:
    """The worker: the parent does not import torch's testing utilities."""
    argv = [__file__, "--worker", str(MAX_SAMPLES)]
    with sweep.Worker(argv, OpResult, "OpInfo", "forward", HANG_SECONDS) as w:
        yield w


def test_known_failures_file(worker: sweep.Worker[OpResult]) -> None:
    missing = worker.unknown(load_opinfo_known_failures())
    assert not missing, f"not OpInfo names: {missing}"
    missing = worker.unknown(FAST_OPS)
    assert not missing, f"FAST_OPS that are not OpInfo names: {missing}"


@pytest.mark.parametrize("name", _selected_ops())
def test_op(name: str, worker: sweep.Worker[OpResult], known_failures: sweep.KnownFailures) -> None:
    sweep.check_entry(worker, name, known_failures, _REPORTS, STRICT)


def summarize(reports: dict[str, OpReport], known: sweep.KnownFailures) -> dict[str, Any]:
    counts = dict.fromkeys(("ops", "samples", "matched", "known", "unexpected", "skipped"), 0)
    counts["ops"] = len(reports)
    by_mode = {m: {"samples": 0, "matched": 0} for m in MODES}
    unexpected: dict[str, list[str]] = {}
    xpass: list[str] = []
    for name, report in reports.items():
        verdict = sweep.judge(report, known)
        for mode, res in report.modes.items():
            counts["samples"] += res.run
            counts["matched"] += len(res.matched)
            counts["skipped"] += res.skipped
            by_mode[mode]["samples"] += res.run
            by_mode[mode]["matched"] += len(res.matched)
        counts["known"] += verdict.known
        counts["unexpected"] += len(verdict.unexpected)
        if verdict.unexpected:
            unexpected[name] = verdict.unexpected
        xpass += verdict.xpass
    counts["match_percent"] = round(100.0 * counts["matched"] / max(counts["samples"], 1), 2)
    slowest = sorted(reports.values(), key=lambda r: -r.seconds)[:10]
    return {
        "counts": counts,
        "by_mode": by_mode,
        "unexpected": unexpected,
        "xpass": xpass,
        "stopped": {n: r.note for n, r in reports.items() if r.note},
        "failures": {
            n: {m: res.failed for m, res in r.modes.items() if res.failed}
            for n, r in reports.items()
            if any(res.failed for res in r.modes.values())
        },
        "bf16_ops": sorted(n for n, r in reports.items() if "bf16" in r.modes),
        "seconds": round(sum(r.seconds for r in reports.values()), 1),
        "slowest": {r.name: round(r.seconds, 2) for r in slowest},
        "op_seconds": {n: round(r.seconds, 3) for n, r in reports.items()},
    }


def _print_summary(summary: dict[str, Any]) -> None:
    c = summary["counts"]
    print(
        f"\nOpInfo over accel: {c['ops']} ops, {c['samples']} samples run, {c['matched']} "
        f"matched ({c['match_percent']}%), {c['known']} known failures, {c['unexpected']} "
        f"unexpected, {c['skipped']} skipped, {len(summary['xpass'])} xpass"
    )
    if FULL or ONLY:
        for mode, m in summary["by_mode"].items():
            print(f"  {mode}: {m['matched']}/{m['samples']} matched")
        for line in summary["xpass"]:
            print(f"  xpass: {line}")
        for name, lines in summary["unexpected"].items():
            print(f"  unexpected: {name}: {len(lines)} samples")


def test_summary(known_failures: sweep.KnownFailures, capsys: pytest.CaptureFixture[str]) -> None:
    if not _REPORTS:
        pytest.skip("no op ran")
    summary = summarize(_REPORTS, known_failures)
    file_name = "opinfo_summary.json" if FULL or ONLY else None
    sweep.report_summary(summary, _print_summary, capsys, file_name)
    c = summary["counts"]
    if c["matched"] < TARGET * c["samples"]:
        pytest.fail(f"{c['match_percent']}% of the samples match, below {TARGET:.0%}", False)
    if summary["unexpected"]:
        pytest.fail(f"unexpected failures: {', '.join(summary['unexpected'])}", False)


def worker_main(max_samples: int) -> None:
    """The worker: checks the OpInfos the parent names (sweep_worker.serve)."""
    sweep.serve(op_db, lambda op, progress: check_op(op, max_samples, progress), FALLBACK)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker_main(int(sys.argv[2]))
