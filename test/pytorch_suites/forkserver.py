"""A fork server for the PyTorch test files that test_pytorch_suites.py runs one process each.

Each of those processes spent about 10 s (on 2 cores) importing torch and torch's testing
utilities before its first test, 25 files in make test: about a sixth of the default lane. This
process imports them once, in the environment of the runs (the runner starts one server per
device: accel through torch's backend autoload, or plain torch for the CPU reference), and forks
a child per file. A child is what a fresh `python -m pytest ...` would be after those imports.

What is preloaded must leave the process fit to fork: no thread but numpy's (and scipy's)
OpenBLAS pools (which handle fork themselves; no OpenMP or accel worker threads yet) and the
accel runtime not started (test_fork.py: counting devices starts nothing). The server checks
both after its imports and refuses to serve otherwise (the runner then starts plain processes,
as before).

Protocol, one JSON object a line: the runner writes {"argv": [...], "env": {...}, "log": path}
(the pytest arguments, variables set in the child, the file its output goes to) on stdin; the
server answers {"pid": n} once the child runs and {"exit": code} when it ended (negative: the
signal that ended it, as subprocess.Popen.returncode). Its first line is {"ready": true} or
{"ready": false, "why": "..."}. End of input ends it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import traceback

PRELOAD = (
    "torch",
    "pytest",
    "expecttest",
    "hypothesis",
    "torch.testing._internal.common_utils",
    "torch.testing._internal.common_device_type",
    "torch.testing._internal.common_dtype",
    "torch.testing._internal.common_cuda",
    "torch.testing._internal.common_methods_invocations",
    "torch.testing._internal.common_nn",
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _unfit_to_fork(expected_threads: int) -> str:
    """Why this process cannot fork children that behave as fresh processes ('' if it can)."""
    threads = _threads()
    if threads != expected_threads or threading.active_count() != 1:
        return f"{threads} threads after the imports, {expected_threads} expected"
    accel = sys.modules.get("torch_accel")
    if accel is not None and accel._C.is_initialized():
        return "the accel runtime started during the imports"
    return ""


def _child(request: dict[str, object]) -> None:
    """Runs pytest as the fresh process would; never returns (SystemExit unwinds the server's
    frames, so that the interpreter's exit handlers run as at the end of a process)."""
    os.environ.update(request["env"])  # type: ignore[arg-type]
    fd = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    argv = [str(a) for a in request["argv"]]  # type: ignore[union-attr]
    sys.argv = ["pytest", *argv]
    import pytest

    raise SystemExit(pytest.main(argv))


def main() -> None:
    # `python -m pytest` puts the working directory first on the path (the files' own folder:
    # test_autograd.py imports autograd/*.py from there), not this script's folder (on
    # PYTHONPATH, for -p plugin, anyway).
    sys.path[0] = os.getcwd()
    why = ""
    # numpy's OpenBLAS starts its thread pool at import (one thread less than the cores), and so
    # does scipy's, where scipy is installed (torch's testing utilities then import it); OpenBLAS
    # handles fork itself (pthread_atfork). No other import may start a thread.
    import numpy  # noqa: F401

    try:
        import scipy.linalg  # noqa: F401
    except ImportError:
        pass
    expected_threads = _threads()
    try:
        for name in PRELOAD:
            __import__(name)
        # The plugins pytest loads from entry points (anyio's alone took 0.9 s a child).
        from importlib.metadata import entry_points

        for plugin in entry_points(group="pytest11"):
            __import__(plugin.module)
    except Exception:  # noqa: BLE001  (the runner falls back to plain processes and says why)
        why = "preloading failed: " + traceback.format_exc(limit=1).strip().splitlines()[-1]
    why = why or _unfit_to_fork(expected_threads)
    out = sys.stdout
    out.write(json.dumps({"ready": not why, "why": why}) + "\n")
    out.flush()
    if why:
        return
    # What the imports made lives as long as the process: kept out of the children's collections
    # (pytest collects twice at its end, 1.5 s a child over torch's objects), and their pages
    # stay shared with the server.
    gc.collect()
    gc.freeze()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        out.write(json.dumps({"exit": code}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
