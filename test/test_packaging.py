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


def _stub_signatures(body: list, prefix: str = "") -> dict[str, list[str] | None]:
    """The stub's names under `prefix`: functions and methods with their parameter names (self
    left out), classes and attributes with None."""
    import ast

    found: dict[str, list[str] | None] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef):
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            if args.vararg is not None:
                names.append("*" + args.vararg.arg)
            is_property = any(getattr(d, "id", "") == "property" for d in node.decorator_list)
            found[prefix + node.name] = None if is_property else [n for n in names if n != "self"]
        elif isinstance(node, ast.ClassDef):
            found[prefix + node.name] = None
            found.update(_stub_signatures(node.body, f"{prefix}{node.name}."))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[prefix + node.target.id] = None
    return found


def _binding_signatures(obj: object, prefix: str = "") -> dict[str, list[str] | None]:
    """The same for the native module: pybind11 writes each function's signature as the first
    line of its docstring."""
    import inspect
    import re

    found: dict[str, list[str] | None] = {}
    for name, value in vars(obj).items():
        if name.startswith("__") and name not in ("__init__", "__call__", "__version__"):
            continue
        if name == "_pybind11_conduit_v1_":  # pybind11's own, on every class
            continue
        if inspect.isclass(value) or inspect.ismodule(value):  # _rt is a submodule
            found[prefix + name] = None
            if getattr(value, "__module__", value.__name__).startswith("torch_accel"):
                found.update(_binding_signatures(value, f"{prefix}{name}."))
        elif isinstance(value, property) or not callable(value):
            found[prefix + name] = None
        else:
            doc = (getattr(obj, name).__doc__ or "").lstrip().splitlines()  # staticmethods too
            match = re.match(r"\w+\((.*)\) ->", doc[0] if doc else "")
            assert match, f"{prefix}{name}: no pybind11 signature in its docstring"
            params = []
            depth = 0
            current = ""
            for ch in match.group(1) + ",":  # split on the commas outside brackets
                if ch in "[(":
                    depth += 1
                elif ch in "])":
                    depth -= 1
                if ch == "," and depth == 0:
                    if current.strip():
                        params.append(re.split(r"[:=]", current.strip())[0].strip())
                    current = ""
                else:
                    current += ch
            found[prefix + name] = [p for p in params if p != "self"]
    return found


def test_the_native_modules_stub_declares_every_binding_with_its_parameters() -> None:
    # The stub lacked 70 of the module's functions (py.typed ships it, so type checkers took
    # its word), and declared _serial_numel with a parameter its binding does not have.
    import ast

    import torch_accel  # noqa: F401  (loads the module as users do)
    from torch_accel import _C

    stub = _stub_signatures(ast.parse((ROOT / "torch_accel" / "_C.pyi").read_text()).body)
    bound = _binding_signatures(_C)
    assert sorted(set(bound) - set(stub)) == [], "bound, not declared in _C.pyi"
    assert sorted(set(stub) - set(bound)) == [], "declared in _C.pyi, not bound"
    differ = {
        name: (stub[name], bound[name])
        for name in bound
        if bound[name] is not None and stub[name] != bound[name]
    }
    assert differ == {}, "parameters in _C.pyi against the binding's"
