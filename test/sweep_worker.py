"""Sweeps of torch's testing databases (OpInfo, ModuleInfo) over accel, in a worker process.

test_opinfo.py and test_module_db.py each check every entry of a database (an OpInfo, a
ModuleInfo: a name, and samples in modes) against the CPU. This module is what they share:

* the worker: the test file run as a script (`python test/test_x.py --worker ...`) calls serve()
  with its database and the function that checks one entry. It reads entry names from stdin, one
  a line, and writes JSON lines to stdout: {"ready": true} once, then for each entry progress
  ({"mode": ..., "sample": ...}) and its Report ({"report": ...}); "?names" asks for the sorted
  names ({"names": [...]}). It exits after a report with a note (the device was left unusable);
* Worker, the tests' side: starts the worker (again after it stops), sends it entries and reads
  their reports; a crash, or a hang (no line in hang_seconds: the worker is killed), fails the
  entry at the sample it was running;
* the known failures (a yaml file: {name: {mode: {reason, samples}}}), the verdict on a report
  (unexpected failures, known ones, known ones that now pass: xpass), the test of one entry, and
  showing and writing a summary;
* what checking a sample needs in the worker: Mismatch, error_text(), device_usable().

The test files `import sweep_worker as sweep`: pytest puts test/ on sys.path (rootdir conftest,
no __init__.py), and a script's own folder is on it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
ACCEL = torch.device("accel")

# progress(mode, sample index): the worker's progress line, sent before each sample runs.
Progress = Callable[[str, int], None]
T = TypeVar("T")


def import_testing_db(module: str, name: str) -> Any:
    """A database of torch's testing utilities (they need expecttest, in requirements-dev), as
    import_testing_db("common_modules", "module_db")."""
    backends = torch.backends.flags_frozen.__globals__  # the module's own globals
    frozen = backends["__allow_nonbracketed_mutation_flag"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = getattr(importlib.import_module(f"torch.testing._internal.{module}"), name)
    # The import freezes the torch.backends flags, for torch's own suites: not for ours.
    backends["__allow_nonbracketed_mutation_flag"] = frozen
    return db


# --- the known failures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    reason: str
    samples: frozenset[int] | None  # the failing samples' indices; None: any sample may fail


KnownFailures = dict[str, dict[str, Known]]  # {name: {mode: Known}}


def load_known_failures(
    path: Path,
    modes: Sequence[str],
    keys: frozenset[str] = frozenset({"reason", "samples"}),
    applies: Callable[[str, dict[str, Any]], bool] = lambda where, entry: True,
) -> KnownFailures:
    """The known failures in a file; keys: the keys an entry may have;
    applies(where, entry): whether an entry applies to this run (it may assert on its keys)."""
    data = yaml.safe_load(path.read_text()) or {}
    known: KnownFailures = {}
    for name, by_mode in data.items():
        assert isinstance(by_mode, dict) and by_mode, f"{name}: expected mode: {{reason: ...}}"
        for mode, entry in by_mode.items():
            assert mode in modes, f"{name}: unknown mode {mode!r}"
            assert isinstance(entry, dict) and entry.get("reason"), f"{name} {mode}: no reason"
            assert set(entry) <= keys, f"{name} {mode}: unknown keys"
            if not applies(f"{name} {mode}", entry):
                continue
            samples = entry.get("samples")
            samples = None if samples is None else frozenset(int(i) for i in samples)
            known.setdefault(name, {})[mode] = Known(str(entry["reason"]), samples)
    return known


# --- checking samples, in the worker -----------------------------------------------------------


class Mismatch(AssertionError):
    """The accel result differs from the CPU's."""


def error_text(e: BaseException) -> str:
    """What went wrong, in a line: a Mismatch's first lines, an error's type and first line."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if isinstance(e, Mismatch):
        return " / ".join(lines[:4])[:500]
    return f"{type(e).__name__}: {(lines[0] if lines else '')[:300]}"


def device_usable() -> bool:
    """Whether the device still runs a kernel (after a failing sample)."""
    try:
        torch.accel.synchronize()
        return torch.ones(2, device=ACCEL).sum().item() == 2.0
    except Exception:  # noqa: BLE001
        return False


@dataclass
class ModeResult:
    """The samples of one mode of an entry; a test file's subclass adds its own counts (a dict
    field is keyed by sample index, as failed)."""

    matched: list[int] = field(default_factory=list)  # indices of the samples that matched
    failed: dict[int, str] = field(default_factory=dict)  # sample index: what went wrong
    skipped: int = 0  # samples the CPU refused, or that have no accel form

    @property
    def run(self) -> int:
        return len(self.matched) + len(self.failed)


R = TypeVar("R", bound=ModeResult)


@dataclass
class Report(Generic[R]):
    """An entry's results by mode."""

    name: str
    modes: dict[str, R] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""  # why the entry stopped early: the device left unusable, a crash, a hang

    @staticmethod
    def from_json(data: dict[str, Any], result: type[R]) -> Report[R]:
        modes = {}
        for mode, res in data["modes"].items():
            # JSON object keys are strings: the sample indices again.
            res = {k: _int_keys(v) if isinstance(v, dict) else v for k, v in res.items()}
            modes[mode] = result(**res)
        return Report(**{**data, "modes": modes})


def _int_keys(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def serve(
    load: Callable[[], dict[str, T]],
    check: Callable[[T, Progress], Report[Any]],
    fallback: str,
) -> None:
    """The worker: load() gives the database by name, check(entry, progress) an entry's report;
    fallback: the CPU fallback mode. Exits when the device is unusable (the parent starts a new
    worker)."""
    import faulthandler

    import torch_accel

    faulthandler.enable()  # a crash shows where
    torch_accel._C._set_fallback_mode(fallback)
    db = load()
    # The database and what torch imported stay alive to the end: out of the garbage
    # collector's sight (each full collection traversed them all).
    gc.collect()
    gc.freeze()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not mix with the reports

    def send(data: dict[str, Any]) -> None:
        out.write(json.dumps(data) + "\n")
        out.flush()

    send({"ready": True})
    for line in sys.stdin:
        name = line.strip()
        if name == "?names":
            send({"names": sorted(db)})
            continue
        report = check(db[name], lambda m, i: send({"mode": m, "sample": i}))
        send({"report": asdict(report)})
        if report.note:
            return


# --- the worker, from the tests ----------------------------------------------------------------


class Worker(Generic[R]):
    """A worker process that checks one entry at a time; started again after it stops.

    argv: the worker's command line after the interpreter (the test file, --worker, ...);
    result: the test file's ModeResult; kind: what an entry is, for messages ("OpInfo");
    first_mode: the mode a crash before the first sample is reported in; hang_seconds: how long
    a sample may run before the worker is taken for hung and killed. As a context manager, it
    closes the worker at the end."""

    def __init__(
        self,
        argv: Sequence[str],
        result: type[R],
        kind: str,
        first_mode: str,
        hang_seconds: float,
    ) -> None:
        self.argv = list(argv)
        self.result = result
        self.kind = kind
        self.first_mode = first_mode
        self.hang_seconds = hang_seconds
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.stderr = tempfile.TemporaryFile()
        self._names: list[str] | None = None
        self.hung = False

    def _start(self) -> None:
        self.stderr.seek(0)
        self.stderr.truncate()
        # The worker sets its fallback mode itself.
        env = {k: v for k, v in os.environ.items() if k != "ACCEL_FALLBACK"}
        self.proc = subprocess.Popen(
            [sys.executable, *self.argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            bufsize=0,
            env=env,
        )
        self.buffer = b""
        first = self._read(120.0)
        assert first == {"ready": True}, f"the worker did not start: {first} {self._stderr()}"

    def _read(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line, or None when the worker exited or the timeout passed (then
        self.hung is set)."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        self.hung = False
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.hung = True
                return None
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def _stderr(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        noise = ("frame #", "No CUDA runtime is found")
        lines = [x.strip() for x in lines if x.strip() and not any(n in x for n in noise)]
        fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
        lines = lines[fatal[0] : fatal[0] + 8] if fatal else lines[-8:]  # faulthandler's stack
        return " / ".join(lines)[-1200:]

    def _send(self, line: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    def names(self) -> list[str]:
        """The entries' names, sorted (the parent does not import torch's testing utilities:
        their import changes global state)."""
        if self._names is None:
            self._send("?names")
            msg = self._read(self.hang_seconds)
            assert msg is not None and "names" in msg, f"no answer: {self._stderr()}"
            self._names = msg["names"]
        return self._names

    def unknown(self, names: Iterable[str]) -> list[str]:
        """Those of names that name no entry, sorted."""
        return sorted(set(names) - set(self.names()))

    def check(self, name: str) -> Report[R]:
        assert name in self.names(), f"no {self.kind} {name!r}"
        self._send(name)
        where: tuple[str, int] | None = None  # the mode and the sample running
        while True:
            msg = self._read(self.hang_seconds)
            if msg is not None and "report" in msg:
                report = Report.from_json(msg["report"], self.result)
                if report.note:
                    self.close()
                return report
            if msg is None:
                return self._lost(name, where)
            where = msg["mode"], msg["sample"]

    def _lost(self, name: str, where: tuple[str, int] | None) -> Report[R]:
        """After a crash or a hang: the entry fails where it was."""
        hung = self.hung
        self.close(0.0 if hung else 10.0)
        assert self.proc is not None
        what = f"hung (no answer in {self.hang_seconds:.0f} s)" if hung else "crashed"
        rc = self.proc.returncode
        if rc is not None and rc < 0 and not hung:
            what += f" ({signal.Signals(-rc).name})"
        mode, index = where or (self.first_mode, 0)
        place = f"in {mode} sample {index}" if where else "before its first sample"
        failure = f"the worker {what} {place}: {self._stderr()}"
        return Report(name, {mode: self.result(failed={index: failure})}, note=failure)

    def close(self, wait: float = 0.0) -> None:
        """Ends the worker: waits `wait` seconds for it to exit, then kills it."""
        if self.proc is None:
            return
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Worker[R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- the tests ---------------------------------------------------------------------------------


@dataclass
class Verdict:
    unexpected: list[str]  # failing samples not known to fail
    known: int  # failing samples known to fail
    xpass: list[str]  # known failures that matched


def judge(report: Report[Any], known: KnownFailures) -> Verdict:
    verdict = Verdict([], 0, [])
    for mode, res in report.modes.items():
        k = known.get(report.name, {}).get(mode)
        for index, text in res.failed.items():
            if k is not None and (k.samples is None or index in k.samples):
                verdict.known += 1
            else:
                verdict.unexpected.append(f"{mode} sample {index}: {text}")
        if k is None:
            continue
        if k.samples is None:
            passing = "" if res.failed or not res.matched else f"all {len(res.matched)} samples"
        else:
            matching = sorted(k.samples.intersection(res.matched))
            passing = f"samples {matching}" if matching else ""
        if passing:
            reason = k.reason if len(k.reason) <= 80 else k.reason[:77] + "..."
            verdict.xpass.append(f"{report.name} {mode}: {passing} match, known as {reason!r}")
    return verdict


def check_entry(
    worker: Worker[Any],
    name: str,
    known: KnownFailures,
    reports: dict[str, Any],
    strict: bool,
) -> None:
    """The test of one entry: checks it in the worker, keeps its report in reports, and fails on
    failures that are not known, and (strict) on xpasses; not strict, xpasses are warnings."""
    report = worker.check(name)
    reports[name] = report
    verdict = judge(report, known)
    problems = list(verdict.unexpected)
    if strict:
        problems += [f"xpass: {line}" for line in verdict.xpass]
    elif verdict.xpass:
        warnings.warn("; ".join(verdict.xpass), stacklevel=2)
    if problems:
        pytest.fail(f"{name}: {len(problems)} unexpected\n" + "\n".join(problems[:6]), False)


def report_summary(
    summary: dict[str, Any],
    show: Callable[[dict[str, Any]], None],
    capsys: pytest.CaptureFixture[str],
    file_name: str | None,
) -> None:
    """Shows a sweep's summary with show(summary) on the terminal (outside pytest's capture),
    then writes it to build/<file_name> (None: does not)."""
    with capsys.disabled():
        show(summary)
    if file_name is not None:
        out = ROOT / "build" / file_name
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(summary, indent=1) + "\n")
