"""The runner's side of forkserver.py: test_pytorch_suites.py starts one server per device and
has it fork a child per test file, which the runner then follows as it would a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class ForkServer:
    """forkserver.py for one device's runs (`env`: their environment), started in `cwd`: a
    process that imported torch and its testing utilities once and forks a child per file (each
    file's own process spent about 10 s on those imports). Where it cannot serve, `ready` is
    false and `why` says why."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("forkserver.py"))],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # the children write to their logs
            text=True,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()  # read unbuffered: select() sees what is unread
        self.pending = b""
        answer = self._read()
        self.ready: bool = answer.get("ready", False)
        self.why: str = answer.get("why", "")

    def answered(self) -> bool:
        """Whether an answer (or the end of the server) can be read without waiting."""
        return b"\n" in self.pending or bool(select.select([self.fd], [], [], 0)[0])

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self.pending:
            data = os.read(self.fd, 4096)
            if not data:
                return {"ready": False, "exit": None, "why": "the fork server ended"}
            self.pending += data
        line, self.pending = self.pending.split(b"\n", 1)
        answer: dict[str, Any] = json.loads(line)
        return answer

    def fork(self, args: list[str], env: dict[str, str], log_path: Path) -> Forked | None:
        assert self.proc.stdin is not None
        request = {"argv": args, "env": env, "log": str(log_path)}
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the server ended: a plain process instead
            pid = None
        else:
            pid = self._read().get("pid")
        if pid is None:
            self.ready, self.why = False, "the fork server ended"
            return None
        return Forked(self, pid)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait()


class Forked:
    """A child of the fork server, with the part of subprocess.Popen's interface that
    test_pytorch_suites.py's _follow uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.server.answered():
            code = self.server._read().get("exit")
            self.returncode = -signal.SIGKILL if code is None else code  # None: the server died
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]
