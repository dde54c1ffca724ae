"""Shared pytest set-up: every test process starts from the default runtime configuration."""

from __future__ import annotations

import os

import pytest

for _name in [n for n in os.environ if n.startswith("ACCEL_")]:
    del os.environ[_name]


@pytest.fixture
def run_python():
    """Runs a Python snippet in a fresh interpreter with extra environment variables."""
    import subprocess
    import sys

    def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        full_env.update(env)
        return subprocess.run(
            [sys.executable, "-c", code],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run
