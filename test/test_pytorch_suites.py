"""PyTorch's own device-generic test files over accel.

The test files of one PyTorch release (v2.6.0, fetched by pytorch_suites/fetch.py into
$PYTORCH_SUITES_DIR, default ~/.cache/torch_accel/pytorch-suites-2.6.0; once, then offline) run
in a process each, under pytest, forked from one that imported torch and its testing utilities
once (pytorch_suites/forkserver.py; PYTORCH_SUITES_FORK=0 starts fresh interpreters instead),
with PYTORCH_TESTING_DEVICE_ONLY_FOR=accel: torch's instantiate_device_type_tests makes their
tests for the PrivateUse1 device (PrivateUse1TestBase:
TestFooPRIVATEUSE1.test_bar_accel_float32), and only those run (plain TestCases, which run on
the CPU whatever the device, are deselected). torch_accel comes in through torch's backend
autoload. pytorch_suites/plugin.py writes each test's outcome as it ends, synchronizes accel
after each test so that an error found by a stream task fails the test that caused it, and adds
back the two names of torch's testing utilities that test_torch.py imports and torch 2.11
removed. A crash or a hang (no test ending in HANG_SECONDS) fails the test that was running; the
file then goes on without the tests that already ran. Files run whole, in a fixed order: some
outcomes depend on what ran before in the process (the first call of an op signature runs
synchronously on accel, and raises its errors in time), so a -k subset may differ from the full
file.

Each failing test must be listed in pytorch_suites/known_failures.yaml (test id: reason), and
each listed test must fail: a listed test that passes (or is skipped) fails the file's test too,
so that the list stays honest. Reasons start with a category: "BUG:" (a defect of the backend),
"CUDA:" (the test assumes that a device other than the CPU is cuda), "CPU:" (torch 2.11's OpInfo
expects the failure, or skips the test, for the CPU only, whose kernel accel runs: the CPU twin is
an expected failure, not a failure), "UNSUPPORTED:" (what accel does not support), "RNG:" (a seeded
statistical check that accel's random stream misses), "DRIFT:" (the test fails on the CPU with torch
2.11 too: a v2.6.0 test against a newer torch), "XPASS:" (torch 2.11's OpInfo marks the test
expectedFailure on every device for a defect that accel does not share: it passes, which unittest
reports as an unexpected success).

Modes:

Every mode leaves out the INCOMPATIBLE test classes (they cannot run against torch 2.11) and
the NOT_RUN tests (left out for their time).

* default (make test): every file but those in FULL_ONLY, without the slow tests in SLOW
  (about 6 min on 2 cores);
* PYTORCH_SUITES_FULL=1: every test of every file (about 180 min);
* PYTORCH_SUITES_FILES=test_a.py,test_b.py: those files only (without SLOW unless FULL too);
* PYTORCH_SUITES_CPU=1 (with any): also runs the files on the CPU (plain torch, no
  torch_accel) as the reference: an accel failure whose CPU twin fails too is drift; checks that
  the DRIFT: entries do fail on the CPU and that no other entry does.

The debug configurations of `make test` (ACCEL_LAUNCH_BLOCKING=1, ACCEL_PROTECT_DEVICE_MEMORY=1)
skip the default run: errors found by stream tasks are raised at once there, which changes the
outcomes; PYTORCH_SUITES_FULL or PYTORCH_SUITES_FILES run anyway (expect differences then).
test_summary prints passed / failed / skipped / known per file with the times, and writes every
outcome to build/pytorch_suites_summary.json. A file that cannot be fetched (no network) is skipped.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITES = HERE / "pytorch_suites"
sys.path.insert(0, str(SUITES))
import fetch  # noqa: E402  (pytorch_suites/fetch.py)
from fork_client import Forked, ForkServer  # noqa: E402  (pytorch_suites/fork_client.py)
from plugin import CLASS_SUFFIXES, cpu_twin, excluded  # noqa: E402  (pytorch_suites/plugin.py)

KNOWN_FAILURES_FILE = SUITES / "known_failures.yaml"
FILES_DIR = Path(
    os.environ.get("PYTORCH_SUITES_DIR")
    or Path.home() / ".cache" / "torch_accel" / f"pytorch-suites-{fetch.VERSION.split('+')[0]}"
).expanduser()
SUMMARY_FILE = ROOT / "build" / "pytorch_suites_summary.json"
LOG_DIR = ROOT / "build" / "pytorch_suites"

_OFF = ("", "0")
FULL = os.environ.get("PYTORCH_SUITES_FULL", "") not in _OFF
ONLY = [n for n in os.environ.get("PYTORCH_SUITES_FILES", "").split(",") if n]
WITH_CPU = os.environ.get("PYTORCH_SUITES_CPU", "") not in _OFF
DEFAULT = not (FULL or ONLY)
# Tests that take seconds each on accel, left out unless PYTORCH_SUITES_FULL: file: test names
# (every instantiation: dtypes, parameters). Times on accel, 2 cores, host driver.
_SPARSE_LAYOUTS = ("SparseCOO", "SparseCSR", "SparseCSC", "SparseBSR", "SparseBSC")
SLOW = {
    # 13-43 s each on accel (1 s on the CPU): all(cond) over a million-element accel tensor, one
    # .item() (a stream synchronization) per element.
    "test_tensor_creation_ops.py": ["test_linspace"],
    # 1-40 s each (3-4x the CPU's): gradcheck over sparse tensors, a stream synchronization per
    # sparse operator (sparse kernels run on the calling thread); 5 of the file's 6.5 minutes.
    "test_sparse.py": [
        *(f"test_constructor_autograd_{layout}" for layout in _SPARSE_LAYOUTS),
        *(
            f"test_as_sparse_gradcheck_{layout}_{masked}_{mode}"
            for layout in _SPARSE_LAYOUTS
            for masked in ("masked", "nonmasked")
            for mode in ("fast", "slow")
        ),
        "test_binary_operation_mul_SparseCOO",
        "test_sparse_matmul",
        "test_bmm",
    ],
    # 7-18 s each, 60 of the file's 122 s: they run on the CPU whatever the device (they move
    # their tensors only to cuda), so accel gains nothing from them
    "test_nn.py": ["test_masked_softmax*"],
    # 2-14 s each: torch.compile of jagged nested tensors (Inductor's C++ compile), 55 of the
    # file's 80 s
    "test_nestedtensor.py": [
        "test_to_padded_tensor_compile_nt_dim_*",
        "test_compile_padded_dense_conversion_preserves_metadata_cache",
        "test_compile_preserves_metadata_cache",
        "test_dummy_mha_with_nt_use_legacy_api_*",
        "test_index_put_error",  # 3.6 s
    ],
    # The ones below were each 1.3-12 s in make test's lanes (2026-12-02, about 3x their time on an
    # idle machine), 120 s together; each kernel keeps tests in the default run (the same
    # operators with other arguments, and the OpInfo sweep's samples).
    # 11-12 s each (4.7x the CPU's): a Python loop over the elements of 0-d accel tensors, a
    # stream synchronization per comparison
    "nn/test_embedding.py": ["test_embedding_bag_1D_padding_idx"],
    # 3-8 s each: torch.use_deterministic_algorithms' paths of gather/scatter/index_copy over
    # large index tensors
    "test_torch.py": [
        "test_gather_backward_deterministic_path",
        "test_scatter_add_one_dim_deterministic",
        "test_index_copy_deterministic",
    ],
    # 1.3-3 s for each of 11 dtypes: one assertEqual against numpy per section count and dim
    # (test_tensor_split_indices runs)
    "test_view_ops.py": ["test_tensor_split_sections"],
    # 1.3 s for each of 14 dtypes (test_scatter_reduce_sum/prod/amax/amin run)
    "test_scatter_gather_ops.py": ["test_scatter_reduce_mean"],
    "test_sort_and_select.py": ["test_sort"],  # 4.4 s (test_stable_sort and the topk tests run)
    # 4-6.5 s each: MAML's inner loops over a small network, and a compiled vmap of a Hessian
    "functorch/test_eager_transforms.py": [
        "test_maml_omniglot_mechanism_*",
        "test_compile_vmap_hessian",
    ],
    # 1.5-2.4 s each: the encoder fast path at d_model 256 (d_model 12 runs), and the compiled
    # causal variants (the eager ones run)
    "test_transformers.py": [
        "test_transformerencoder_fastpath_*_d_model_256",
        "test_causal_variants_compile_*",
    ],
}
# Files that run only with PYTORCH_SUITES_FULL or when named in PYTORCH_SUITES_FILES (times on
# accel, 2 cores, host driver).
FULL_ONLY = {
    # 3 min, the longest file of the default run until it moved here to keep `make test` within
    # CI's 20 minutes (test/test_sparse_tensors.py covers accel's sparse tensors there)
    "test_sparse.py",
    "test_sparse_csr.py",  # 3 min: 4700 tests of the kernels test_sparse.py covers
    "test_reductions.py",  # 2 min
    "nn/test_convolution.py",  # 50 s
    "nn/test_pooling.py",  # 1 min
    "test_binary_ufuncs.py",  # 9 min
    "test_unary_ufuncs.py",  # 9.5 min
    "test_foreach.py",  # 5.5 min
    "test_linalg.py",  # 2.5 min
    "test_optim.py",  # 4.5 min
    "test_masked.py",  # 1.5 min
    "test_ops_gradients.py",  # 18.5 min: gradcheck of every OpInfo on accel
    "test_ops_fwd_gradients.py",  # 12.5 min: forward-mode AD of every OpInfo
    "test_maskedtensor.py",  # 1.5 min
    "test_schema_check.py",  # 10 min: every OpInfo under SchemaCheckMode (aliasing, mutation)
    "test_modules.py",  # 7 min: every ModuleInfo (forward, gradients, memory formats)
    # 47 min (with other jobs running): every OpInfo's out=, noncontiguous, variant, conj/neg
    # view, fake tensor, copy-on-write, error-input, dtype and gradient tests; and 26 min more
    # alone: its 14,200 tests of PyTorch's Python references (torch._refs) against accel's
    # operators (test_python_ref*)
    "test_ops.py",
    # 1 min alone, 1.6 min in make test's lanes (1053 tests of the nn modules and functionals,
    # none of which failed on accel when it was added)
    "test_nn.py",
    # 20 s: per-sample gradients (torch.nn.utils._expanded_weights, Opacus' mechanism) of the nn
    # modules, none of which failed on accel when it was added
    "test_expanded_weights.py",
    "test_fake_tensor.py",  # 12 s: fake accel tensors (device propagation, constructors)
    # 14 min: PyTorch's decompositions (Inductor's) against accel's kernels, every OpInfo's
    # first samples (test_quick)
    "test_decomp.py",
    # 17 s: torch's testing utilities (make_tensor, assertEqual, OpInfo dtypes) on accel
    "test_testing.py",
}
EXCLUDE = [f"{f}::*::{name}_{{device}}*" for f, names in SLOW.items() for name in names]
# Test classes of the v2.6.0 files that cannot run against torch 2.11 at all (every test fails
# on the CPU too): left out in every mode.
INCOMPATIBLE = {
    # torch 2.11's njt_op_db yields SampleInputs from sample_inputs(use_subtests=True) where the
    # file unpacks (sample, subtest context) pairs: "too many values to unpack" in all 816 tests
    "test_nestedtensor.py": ["TestNestedTensorOpInfo"],
    # the same change (sample_inputs(use_subtests=True)): 1221 of its tests fail on the CPU too
    "functorch/test_vmap.py": ["TestVmapOperatorsOpInfo"],
}
# Tests left out in every mode for their time: file: test name patterns.
NOT_RUN = {
    # every OpInfo sample of every dtype (test_quick takes the first samples): hours on 2
    # cores; the backward of each decomposition against autograd's in float64: 5-40 s per
    # operator on accel (twice the CPU's: thousands of tiny operations). Not yet run on accel.
    "test_decomp.py": ["test_comprehensive*", "test_quick_core_backward*"],
}
ALWAYS_EXCLUDED = [f"{f}::{cls}*::*" for f, classes in INCOMPATIBLE.items() for cls in classes] + [
    f"{f}::*::{name}" for f, names in NOT_RUN.items() for name in names
]
# What this run leaves out (the slow tests unless FULL, the INCOMPATIBLE classes always).
RUN_EXCLUDE = ALWAYS_EXCLUDED + ([] if FULL else EXCLUDE)
DEBUG_MODES = ("ACCEL_LAUNCH_BLOCKING", "ACCEL_PROTECT_DEVICE_MEMORY")
# No test starting or ending for this long is a hang: the subprocess is killed.
HANG_SECONDS = float(os.environ.get("PYTORCH_SUITES_HANG_SECONDS", 180))
FILES = list(fetch.FILES)
CATEGORIES = ("BUG:", "CUDA:", "CPU:", "UNSUPPORTED:", "RNG:", "DRIFT:", "XPASS:")


# --- the known failures ------------------------------------------------------------------------


def load_known_failures() -> dict[str, str]:
    """{accel test id: reason} from known_failures.yaml."""
    data = yaml.safe_load(KNOWN_FAILURES_FILE.read_text()) or {}
    assert isinstance(data, dict), "known_failures.yaml: expected a mapping test id: reason"
    known: dict[str, str] = {}
    for test_id, reason in data.items():
        assert isinstance(reason, str) and reason.strip(), f"{test_id}: no reason"
        assert reason.startswith(CATEGORIES), f"{test_id}: reason must start with {CATEGORIES}"
        parts = str(test_id).split("::")
        assert len(parts) == 3 and parts[0] in FILES, f"{test_id}: not file.py::Class::test"
        assert parts[1].endswith(CLASS_SUFFIXES["accel"]), f"{test_id}: not an accel test"
        known[str(test_id)] = reason
    return known


def known_in_run(known: dict[str, str], name: str) -> dict[str, str]:
    """The known failures of a file that this run selects (without SLOW's unless FULL)."""
    prefix = name + "::"
    return {
        t: r
        for t, r in known.items()
        if t.startswith(prefix) and not excluded(t, "accel", RUN_EXCLUDE)
    }


# --- running a file ----------------------------------------------------------------------------


@dataclass
class Outcome:
    outcome: str  # passed | failed | skipped
    message: str = ""
    seconds: float = 0.0


@dataclass
class FileRun:
    name: str
    device: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    restarts: list[str] = field(default_factory=list)  # tests that crashed or hung
    error: str = ""  # the file could not run (collection error)

    def counts(self) -> Counter[str]:
        return Counter(o.outcome for o in self.outcomes.values())


def _environment(device: str, report: Path, deselect: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "PYTORCH_"))}
    env.update({k: os.environ[k] for k in DEBUG_MODES if k in os.environ})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUITES), os.environ.get("PYTHONPATH")]))
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = device
    env["PYTORCH_SUITES_DEVICE"] = device
    env["PYTORCH_SUITES_REPORT"] = str(report)
    env["PYTORCH_SUITES_DESELECT"] = str(deselect)
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    env["PYTORCH_SUITES_EXCLUDE"] = ",".join(RUN_EXCLUDE)
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the reference: plain torch
    else:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"  # torch_accel comes in with import torch
        env["ACCEL_FALLBACK"] = "silent"  # tests that assert no warnings must not see ours
    return env


def run_file(name: str, device: str) -> FileRun:
    """Runs one test file on one device, again after each crash or hang, until every test ran."""
    run = FileRun(name, device)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{Path(name).stem}.{device}.log"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pytorch_suites.") as tmp, log_path.open("w") as log:
        report, deselect = Path(tmp) / "report.jsonl", Path(tmp) / "deselect.txt"
        deselect.touch()
        env = _environment(device, report, deselect)
        args = ["-q", "-p", "plugin", "-p", "no:cacheprovider"]
        args += ["-c", os.devnull, "--rootdir", str(FILES_DIR), "-o", "addopts=", name]
        while True:
            report.write_text("")
            proc = _start(device, args, env, log, log_path)
            running, hung = _follow(proc, report, run)
            if running is None:
                if proc.returncode in (0, 1, 5):
                    break  # every test ran (1: some failed; 5: none left, after a restart)
                log.flush()
                tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
                what = "hung outside any test" if hung else f"exited with {proc.returncode}"
                run.error = f"pytest {what}: " + " / ".join(tail)
                break
            what = f"hung (no test ended in {HANG_SECONDS:.0f} s)" if hung else "crashed"
            if proc.returncode < 0 and not hung:
                what += f" ({signal.Signals(-proc.returncode).name})"
            run.outcomes[running] = Outcome("failed", f"the test process {what}")
            run.restarts.append(running)
            deselect.write_text("".join(f"{t}\n" for t in run.outcomes))
            print(f"\n  {name} on {device}: {running} {what}: going on", file=sys.stderr)
    run.seconds = time.perf_counter() - start
    return run


_SERVERS: dict[str, ForkServer] = {}


def _start(
    device: str, args: list[str], env: dict[str, str], log: IO[str], log_path: Path
) -> subprocess.Popen[bytes] | Forked:
    """A test process for one file: forked by the device's fork server where it serves
    (PYTORCH_SUITES_FORK=0 turns it off), else a fresh interpreter."""
    if os.environ.get("PYTORCH_SUITES_FORK", "1") not in _OFF:
        server = _SERVERS.get(device)
        if server is None:
            server_env = _environment(device, Path(os.devnull), Path(os.devnull))
            server = _SERVERS[device] = ForkServer(server_env, FILES_DIR)
            atexit.register(server.close)
        if server.ready:
            log.flush()
            forked = server.fork(args, env, log_path)
            if forked is not None:
                return forked
    command = [sys.executable, "-m", "pytest", *args]
    return subprocess.Popen(command, cwd=FILES_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)


def _follow(
    proc: subprocess.Popen[bytes] | Forked, report: Path, run: FileRun
) -> tuple[str | None, bool]:
    """Reads the plugin's events until the process ends (or hangs: then kills it). Returns the
    test that was running when it ended (None if none was) and whether it hung."""
    running: str | None = None
    offset = 0
    last_event = time.monotonic()
    hung = False

    def read() -> None:
        nonlocal running, offset, last_event
        with report.open() as f:
            f.seek(offset)
            data = f.read()
        lines = data.split("\n")
        offset += len(data) - len(lines[-1])  # a partial last line waits for the next read
        for line in lines[:-1]:
            event: dict[str, Any] = json.loads(line)
            last_event = time.monotonic()
            if "start" in event:
                running = event["start"]
            else:
                run.outcomes[event["id"]] = Outcome(
                    event["outcome"], event.get("message", ""), event.get("seconds", 0.0)
                )
                running = None

    while proc.poll() is None:
        time.sleep(0.2)
        read()
        if time.monotonic() - last_event > HANG_SECONDS:
            hung = True
            proc.kill()
            proc.wait()
    read()
    return running, hung


# --- judging -----------------------------------------------------------------------------------


@dataclass
class Verdict:
    unexpected: dict[str, str] = field(default_factory=dict)  # failing, not listed: message
    not_failing: dict[str, str] = field(default_factory=dict)  # listed, passed or skipped
    known: int = 0
    drift_unconfirmed: list[str] = field(default_factory=list)  # DRIFT: passes on the CPU
    cpu_fails_too: list[str] = field(default_factory=list)  # listed as BUG etc., CPU fails


def judge(run: FileRun, known: dict[str, str], cpu: FileRun | None) -> Verdict:
    """Compares a file's accel outcomes with its known failures (those of the run's selection)
    and, given the CPU reference run, checks the DRIFT: entries."""
    verdict = Verdict()
    for test_id, o in run.outcomes.items():
        reason = known.get(test_id)
        if o.outcome == "failed":
            if reason is not None:
                verdict.known += 1
                continue
            message = o.message
            if cpu is not None and _fails(cpu, test_id):
                message = f"[fails on the CPU too: DRIFT] {message}"
            verdict.unexpected[test_id] = message
        elif reason is not None:
            verdict.not_failing[test_id] = f"{o.outcome}, listed as {reason[:100]!r}"
    for test_id in sorted(set(known) - set(run.outcomes)):
        verdict.not_failing[test_id] = "not run: no such test (any more)"
    if cpu is not None:
        for test_id, reason in known.items():
            if test_id not in run.outcomes:
                continue
            drift = reason.startswith("DRIFT:")
            if drift and not _fails(cpu, test_id):
                verdict.drift_unconfirmed.append(test_id)
            elif not drift and _fails(cpu, test_id):
                verdict.cpu_fails_too.append(test_id)
    return verdict


def _fails(cpu: FileRun, accel_id: str) -> bool:
    o = cpu.outcomes.get(cpu_twin(accel_id, "accel"))
    return o is not None and o.outcome == "failed"


# --- the tests ---------------------------------------------------------------------------------

_RUNS: dict[str, dict[str, FileRun]] = {}


def _selected_files() -> list[str]:
    return ONLY or [f for f in FILES if FULL or f not in FULL_ONLY]


@pytest.fixture(scope="module")
def known_failures() -> dict[str, str]:
    return load_known_failures()


@pytest.fixture(scope="module")
def files_dir() -> Path:
    if any(os.environ.get(k, "") not in _OFF for k in DEBUG_MODES) and DEFAULT:
        pytest.skip("runs in the default configuration only (see the docstring)")
    cache = Path(os.environ.get(fetch.CACHE_ENV) or fetch.DEFAULT_CACHE).expanduser()
    try:
        fetch.fetch(FILES_DIR, cache)
    except (OSError, RuntimeError, tarfile.TarError) as error:
        pytest.skip(f"PyTorch's test files could not be fetched: {error}")
    return FILES_DIR


def test_known_failures_file(known_failures: dict[str, str]) -> None:
    unknown = sorted(set(ONLY) - set(FILES))
    assert not unknown, f"PYTORCH_SUITES_FILES: not fetched by fetch.py: {unknown}"
    assert set(SLOW) <= set(FILES), "SLOW: not fetched by fetch.py"
    assert set(INCOMPATIBLE) <= set(FILES), "INCOMPATIBLE: not fetched by fetch.py"
    assert set(NOT_RUN) <= set(FILES), "NOT_RUN: not fetched by fetch.py"
    assert FULL_ONLY <= set(FILES), "FULL_ONLY: not fetched by fetch.py"


@pytest.mark.parametrize("name", _selected_files())
def test_suite(name: str, files_dir: Path, known_failures: dict[str, str]) -> None:
    runs = {"accel": run_file(name, "accel")}
    if WITH_CPU:
        runs["cpu"] = run_file(name, "cpu")
    _RUNS[name] = runs
    accel = runs["accel"]
    assert not accel.error, f"{name} on accel: {accel.error}"
    if "cpu" in runs:
        assert not runs["cpu"].error, f"{name} on the CPU: {runs['cpu'].error}"
    assert accel.outcomes, f"{name}: no test ran"
    verdict = judge(accel, known_in_run(known_failures, name), runs.get("cpu"))
    problems = [f"unexpected failure: {t}: {m}" for t, m in verdict.unexpected.items()]
    problems += [
        f"known failure that did not fail: {t}: {m}" for t, m in verdict.not_failing.items()
    ]
    problems += [f"DRIFT: but passes on the CPU: {t}" for t in verdict.drift_unconfirmed]
    problems += [f"fails on the CPU too, list it as DRIFT: {t}" for t in verdict.cpu_fails_too]
    if problems:
        pytest.fail(f"{name}: {len(problems)} problems\n" + "\n".join(problems[:40]), False)


def summarize(known: dict[str, str]) -> dict[str, Any]:
    files: dict[str, Any] = {}
    for name, runs in _RUNS.items():
        entry: dict[str, Any] = {}
        for device, run in runs.items():
            c = run.counts()
            failed = [t for t, o in run.outcomes.items() if o.outcome == "failed"]
            entry[device] = {
                "tests": len(run.outcomes),
                "passed": c["passed"],
                "failed": c["failed"],
                "skipped": c["skipped"],
                "known": sum(t in known for t in failed) if device == "accel" else None,
                "seconds": round(run.seconds, 1),
                "crashed_or_hung": run.restarts,
                "failures": {t: run.outcomes[t].message for t in failed},
                "skip_reasons": dict(
                    Counter(
                        o.message[:120] for o in run.outcomes.values() if o.outcome == "skipped"
                    ).most_common()
                ),
                # the 15 slowest, and every other test of half a second or more (what SLOW
                # is chosen from)
                "slowest": {
                    t: o.seconds
                    for i, (t, o) in enumerate(
                        sorted(run.outcomes.items(), key=lambda kv: -kv[1].seconds)
                    )
                    if i < 15 or o.seconds >= 0.5
                },
            }
        files[name] = entry
    return {
        "mode": "full" if FULL else "without the slow tests",
        "files": files,
    }


def test_summary(known_failures: dict[str, str], capsys: Any) -> None:
    if not _RUNS:
        pytest.skip("no file ran")
    summary = summarize(known_failures)
    with capsys.disabled():
        print(f"\nPyTorch {fetch.VERSION} test files over accel ({summary['mode']}):")
        for device, server in _SERVERS.items():
            how = "forked from one that imported torch once" if server.ready else server.why
            print(f"  processes on {device}: {how}")
        width = max(len("file"), *(len(name) for name in summary["files"]))
        header = f"  {'file':{width}} {'device':6} {'passed':>7} {'failed':>7} {'skipped':>7}"
        print(header + f" {'known':>6} {'seconds':>8}")
        for name, entry in summary["files"].items():
            for device, c in entry.items():
                known = "" if c["known"] is None else c["known"]
                print(
                    f"  {name:{width}} {device:6} {c['passed']:7} {c['failed']:7} {c['skipped']:7}"
                    f" {known:>6} {c['seconds']:8.1f}"
                )
    SUMMARY_FILE.parent.mkdir(exist_ok=True)
    SUMMARY_FILE.write_text(json.dumps(summary, indent=1) + "\n")
    # Importing torch (with torch_accel) and its testing utilities must leave a process that can
    # fork: no thread started, no runtime started (what makes forked DataLoader workers work too).
    unfit = {device: server.why for device, server in _SERVERS.items() if not server.ready}
    assert not unfit, f"the fork server could not serve: {unfit}"
