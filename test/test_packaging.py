"""What a wheel of torch_accel ships (make install is editable, so the tests never see a wheel).

Building a wheel compiles the C++ library (minutes); these checks read the packaging
configuration instead, the way setuptools reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import setuptools

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the development environment's)

ROOT = Path(__file__).resolve().parent.parent


def _configuration() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_the_wheel_ships_every_python_package_of_torch_accel() -> None:
    # The list was fixed to torch_accel and torch_accel.accel: a wheel lacked _inductor,
    # _dynamo, distributed, ops, kernels and profiler, and `import torch_accel` failed.
    config = _configuration()
    assert "find" in config["packages"], "a fixed package list: use packages.find"
    shipped = set(setuptools.find_packages(str(ROOT), **config["packages"]["find"]))
    sources = {
        ".".join(d.relative_to(ROOT).parts)
        for d in (ROOT / "torch_accel").rglob("*")
        if d.is_dir() and any(d.glob("*.py"))
    } | {"torch_accel"}
    sources.add("_torch_accel_triton")  # Triton's compiler for accel (its entry point's)
    assert sources <= shipped, f"not in the wheel: {sorted(sources - shipped)}"
    assert all(p.split(".")[0] in ("torch_accel", "_torch_accel_triton") for p in shipped), shipped


def test_the_entry_points_name_modules_the_wheel_ships() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]
    config = _configuration()
    shipped = set(setuptools.find_packages(str(ROOT), **config["packages"]["find"]))
    modules = set(config["py-modules"])
    for group in entry_points.values():
        for target in group.values():
            module = target.split(":")[0]
            if module in shipped:  # a package (Triton's backends: compiler and driver modules)
                assert (ROOT / module / "__init__.py").exists(), target
                continue
            package = module.rpartition(".")[0]
            assert module in modules or package in shipped, f"{target}: not in the wheel"
            assert (ROOT / (module.replace(".", "/") + ".py")).exists(), target
