"""Shared pytest set-up for the accel test suites.

Every test process starts from the default runtime configuration: ACCEL_* variables are removed,
except the driver choice (ACCEL_DRIVER, ACCEL_DRIVER_PATH: the suites run on whichever driver is
asked for), the language of compiled kernels (ACCEL_INDUCTOR_KERNELS: test_compile_triton.py's
interpreted run) and the two debug modes the whole suite is also run under (make test-python runs it
with ACCEL_LAUNCH_BLOCKING=1 and with ACCEL_PROTECT_DEVICE_MEMORY=1 too). The CPU fallback is silent
unless a test asks otherwise (tests that check warnings set the mode).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_KEPT = (
    "ACCEL_DRIVER",
    "ACCEL_DRIVER_PATH",
    "ACCEL_INDUCTOR_KERNELS",
    "ACCEL_LAUNCH_BLOCKING",
    "ACCEL_PROTECT_DEVICE_MEMORY",
)
for _name in [n for n in os.environ if n.startswith("ACCEL_") and n not in _KEPT]:
    del os.environ[_name]
# Inductor's C++ backend checks the CPU's vector ISAs once per process by importing torch in a
# subprocess per ISA (about 10 s on 2 cores); the test processes (and the fresh interpreters they
# start) trust the CPU's flags instead. Inductor picks the same ISA where the check passes.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import torch  # noqa: E402  (after the environment is cleaned)

import torch_accel  # noqa: E402

DEBUG_MODES = ("ACCEL_LAUNCH_BLOCKING", "ACCEL_PROTECT_DEVICE_MEMORY")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "config_independent: checks nothing the debug modes change (generated code, Triton's "
        "interpreter on CPU tensors); runs in the default configuration only",
    )
    config.addinivalue_line(
        "markers",
        "default_only: one more case of a kind the debug modes already run (another scheduler, "
        "another model of a family), left to the default configuration for time",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Moves what the imports and the collection made (torch's, transformers', torchvision's
    millions of objects) out of the garbage collector's sight: each full collection traversed
    them all, 28% of test_third_party.py, test_graphs.py and test_cuda_like.py's time (22 s of
    79 s; 7.5 s of 64 s frozen). Collected first, so that no garbage is kept; frozen objects are
    still freed when their last reference goes."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under a debug mode, skips the tests marked default_only, and those whose outcome cannot
    depend on it: those marked config_independent, and those that use run_python (their subject
    runs in a fresh interpreter without the ACCEL_* settings, the same in every configuration)."""
    modes = [m for m in DEBUG_MODES if os.environ.get(m, "") not in ("", "0")]
    if not modes:
        return
    skip = pytest.mark.skip(reason=f"unaffected by {'/'.join(modes)}: the default run has it")
    once = pytest.mark.skip(reason="default_only: others of its kind run here, this one by default")
    for item in items:
        if item.get_closest_marker("default_only"):
            item.add_marker(once)
        elif item.get_closest_marker("config_independent") or "run_python" in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _silent_fallback() -> Iterator[None]:
    torch_accel._C._set_fallback_mode("silent")
    yield
    torch_accel._C._set_fallback_mode("silent")


@pytest.fixture
def fallback_mode() -> Iterator[object]:
    """Sets the CPU fallback mode for one test: fallback_mode("warn")."""

    def set_mode(mode: str) -> None:
        torch_accel._C._set_fallback_mode(mode)

    yield set_mode


@pytest.fixture
def no_fallback(fallback_mode: Callable[[str], None]) -> Iterator[None]:
    """Forbids the CPU fallback for one test and checks that no operator took it."""
    fallback_mode("error")
    torch.accel.reset_fallback_stats()
    yield
    assert torch.accel.fallback_stats() == {}


@pytest.fixture
def force_fallback() -> Iterator[None]:
    """Routes every underlying operator through the copying CPU fallback for one test (almost
    every operator has an accel kernel, so the fallback needs this to be tested at all)."""
    torch_accel._C._set_force_fallback(True)
    try:
        yield
    finally:
        torch_accel._C._set_force_fallback(False)


@pytest.fixture
def run_python():
    """Runs a Python snippet in a fresh interpreter with extra environment variables."""

    def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        full_env.update(env)
        return subprocess.run(
            [sys.executable, "-c", code],
            env=full_env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run


# Where make test-cpp builds the C++ suites' driver libraries.
_CPP_TEST_BUILD = Path(__file__).resolve().parent.parent / "build" / "test" / "cpp"


@pytest.fixture
def test_driver():
    """The environment that selects one of the C++ test drivers (test/cpp/test_driver_plugin.cpp:
    testdrv, limited, fragile, ...) for run_python; skips where make test-cpp has not built them."""
    drivers = _CPP_TEST_BUILD / "drivers"

    def env(name: str) -> dict[str, str]:
        if not (drivers / f"libaccel_driver_{name}.so").exists():
            pytest.skip(f"the C++ test driver {name} is not built (make test-cpp builds it)")
        return {"ACCEL_DRIVER": name, "ACCEL_DRIVER_PATH": str(drivers)}

    return env


@pytest.fixture
def emulated_cuda() -> dict[str, str]:
    """The environment that selects the cuda driver built on the emulated CUDA runtime
    (test/cpp/cuda_emulator) for run_python; skips where make test-cpp has not built it (no CUDA
    toolkit)."""
    path = _CPP_TEST_BUILD / "emulated_cuda"
    if not (path / "libaccel_driver_cuda.so").exists():
        pytest.skip("the cuda driver on the emulated CUDA runtime is not built (make test-cpp)")
    return {"ACCEL_DRIVER": "cuda", "ACCEL_DRIVER_PATH": str(path)}
