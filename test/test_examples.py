"""The examples run as documented: the transformer quickstart of `make demo` trains on accel with
no CPU fallback and the CPU's losses, in float32 and under bfloat16 autocast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--steps", "20"], id="float32"),
        # the debug modes run the float32 one (test_amp.py runs autocast there): 50 s less. Eight
        # steps: bf16 products are emulated on CPUs without AVX-512 BF16, on both sides (20
        # steps took 28 s in make test's lanes)
        pytest.param(["--steps", "8", "--amp"], id="bf16-autocast", marks=pytest.mark.default_only),
    ],
)
def test_transformer_example_trains_like_the_cpu(flags: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transformer_lm.py"), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "OK"
    assert lines[-2].endswith("CPU fallback calls: 0")


def test_memory_profile_example_writes_the_viewer_pages(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "memory_profile.py"), "--steps", "2", "--out",
         str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    events = int(result.stdout.split(" allocator events")[0].split()[-1])
    assert events > 100
    for kind in ("trace_plot", "segment_plot"):
        assert "snapshot.pickle" in (tmp_path / f"{kind}.html").read_text()
