"""A pytest plugin for the PyTorch test files that test_pytorch_suites.py runs in a subprocess.

Loaded with ``-p plugin`` (this folder on PYTHONPATH). It writes one JSON line per event to the
file named by $PYTORCH_SUITES_REPORT, flushed at once, so that a crash or a hang still leaves
the outcomes of the tests before it, and the test that was running:

    {"start": nodeid}
    {"id": nodeid, "outcome": "passed" | "failed" | "skipped", "seconds": 0.1, "message": "..."}

Only the tests instantiated for a device run (classes made by instantiate_device_type_tests).
Deselected: tests that match a pattern of $PYTORCH_SUITES_EXCLUDE (fnmatch patterns separated by
commas, "{device}" standing for the device: the slow tests), and the tests named in the file
$PYTORCH_SUITES_DESELECT (one node id a line: the runner restarts a file after a crash or a hang
without the tests that already ran).

On accel ($PYTORCH_SUITES_DEVICE=accel) the device is synchronized after each test: an error
that a stream task found (an index out of range checked in the kernel) fails the test that
enqueued the work, instead of the next test that happens to synchronize.

Classes instantiated for both the CPU and cuda are instantiated for accel too (see
_instantiate_cpu_and_cuda_classes_for_accel).

It also adds back the few names of torch's testing utilities that the v2.6.0 files import and
torch 2.11 removed (see _compat_shims), so that the files import at all, and rebinds the
`super(self.__class__, self)` of v2.6.0's test_linalg.py (see _fix_super_of_own_class).
"""

from __future__ import annotations

import fnmatch
import gc
import inspect
import json
import os
import sys
import textwrap
import time
from collections.abc import Generator
from typing import IO, Any

import pytest

_OUT: IO[str] | None = None
_RESULTS: dict[str, dict[str, Any]] = {}
_STARTED: dict[str, float] = {}
MESSAGE_CHARS = 400


def _write(data: dict[str, Any]) -> None:
    if _OUT is not None:
        _OUT.write(json.dumps(data) + "\n")
        _OUT.flush()


def _compat_shims() -> None:
    """Names the v2.6.0 test files import that torch 2.11 no longer has."""
    from torch.testing._internal import common_cuda, common_mkldnn

    # Both removed after 2.6; test_torch.py imports them.
    if not hasattr(common_cuda, "tf32_is_not_fp32"):
        common_cuda.tf32_is_not_fp32 = lambda: False  # no TF32 here
    if not hasattr(common_mkldnn, "bf32_on_and_off"):  # became reduced_f32_on_and_off

        def bf32_on_and_off(bf32_precision: float = 1e-2) -> Any:
            return common_mkldnn.reduced_f32_on_and_off(bf32_precision=bf32_precision)

        common_mkldnn.bf32_on_and_off = bf32_on_and_off

    from torch.testing._internal import common_utils

    # Moved to torch.utils._dtype_abbrs after 2.6; test_meta.py imports it from common_utils.
    if not hasattr(common_utils, "dtype_abbrs"):
        from torch.utils._dtype_abbrs import dtype_abbrs

        common_utils.dtype_abbrs = dtype_abbrs

    from torch.testing._internal import common_nn

    # A list until 2.6, a function making it since; test_nn.py imports the list (for TestNN,
    # a plain TestCase that this runner deselects).
    if not hasattr(common_nn, "new_module_tests"):
        common_nn.new_module_tests = common_nn.get_new_module_tests()

    from torch.nn.attention import flex_attention

    # Removed after 2.6; test_nestedtensor.py imports it for its flex_attention tests, which
    # then fail with this error (on the CPU too).
    if not hasattr(flex_attention, "create_nested_block_mask"):

        def create_nested_block_mask(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("create_nested_block_mask was removed after torch 2.6")

        flex_attention.create_nested_block_mask = create_nested_block_mask

    # Removed after 2.6; test_python_dispatch.py imports register_functional_op from it for
    # plain TestCases (deselected here), not for its device-generic tests.
    try:
        import torch._custom_op.functional  # noqa: F401
    except ModuleNotFoundError:
        import sys
        import types

        def register_functional_op(*args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("register_functional_op was removed after torch 2.6")

        module = types.ModuleType("torch._custom_op.functional")
        module.register_functional_op = register_functional_op  # type: ignore[attr-defined]
        sys.modules["torch._custom_op.functional"] = module


def _instantiate_cpu_and_cuda_classes_for_accel() -> None:
    """A class instantiated `only_for=("cpu", "cuda")` (test_transformers.py's TestTransformers,
    TestSDPA, TestAttnBias; test_autograd.py's TestAutogradMultipleDispatch) is device-generic
    code that names the two devices PyTorch's CI has: it is instantiated for accel too. A class
    for one of them only (`only_for="cuda"`, TestSDPACudaOnly) stays that device's."""
    import torch
    from torch.testing._internal import common_device_type

    instantiate = common_device_type.instantiate_device_type_tests
    if getattr(instantiate, "_accel_suites", False):
        return
    backend = torch._C._get_privateuse1_backend_name()

    def instantiate_device_type_tests(*args: Any, only_for: Any = None, **kwargs: Any) -> Any:
        if isinstance(only_for, (tuple, list)) and {"cpu", "cuda"} <= set(only_for):
            only_for = (*only_for, backend)
        return instantiate(*args, only_for=only_for, **kwargs)

    instantiate_device_type_tests._accel_suites = True  # type: ignore[attr-defined]
    common_device_type.instantiate_device_type_tests = instantiate_device_type_tests


def pytest_configure(config: pytest.Config) -> None:
    global _OUT
    _compat_shims()
    _instantiate_cpu_and_cuda_classes_for_accel()
    path = os.environ.get("PYTORCH_SUITES_REPORT")
    if path:
        _OUT = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole session)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _OUT
    if _OUT is not None:
        _OUT.close()
        _OUT = None


def _device_generic(item: pytest.Item) -> bool:
    """Whether the test is one instantiated for a device (TestFooPRIVATEUSE1.test_bar_accel),
    not one of a plain TestCase that runs on the CPU whatever the device."""
    from torch.testing._internal.common_device_type import DeviceTypeTestBase

    cls = getattr(item, "cls", None)
    return cls is not None and issubclass(cls, DeviceTypeTestBase)


# The class suffixes of instantiate_device_type_tests: a PrivateUse1 class is named after
# "privateuse1" until PrivateUse1TestBase.setUpClass ran, after the backend's name from then on.
CLASS_SUFFIXES = {"accel": ("PRIVATEUSE1", "ACCEL"), "cpu": ("CPU",)}


def cpu_twin(test_id: str, device: str) -> str:
    """The id of the same test instantiated for the CPU:
    f.py::TestFooPRIVATEUSE1::test_bar_accel_float32 -> f.py::TestFooCPU::test_bar_cpu_float32.
    The device suffix is the last _<device> of the name (only dtype suffixes come after it)."""
    if device == "cpu":
        return test_id
    path, cls, name = test_id.split("::")
    for suffix in CLASS_SUFFIXES[device]:
        if cls.endswith(suffix):
            cls = cls[: -len(suffix)] + "CPU"
            break
    head, sep, tail = name.rpartition("_" + device)
    if sep:
        name = f"{head}_cpu{tail}"
    return f"{path}::{cls}::{name}"


def excluded(test_id: str, device: str, patterns: list[str]) -> bool:
    """Whether a test matches one of the patterns ("{device}" stands for the device's name)."""
    return any(fnmatch.fnmatchcase(test_id, p.replace("{device}", device)) for p in patterns)


SUPER_OF_OWN_CLASS = "super(self.__class__, self)"


def _fix_super_of_own_class(classes: set[type]) -> None:
    """v2.6.0's TestLinalg.setUp and tearDown call super(self.__class__, self). torch 2.6's
    instantiate_device_type_tests derived TestLinalgCPU from a copy of TestLinalg, where that
    reached TestCase; 2.11's derives it from TestLinalg itself, so it calls TestLinalg.setUp
    again, forever (RecursionError in every test, on the CPU too). Each such method is compiled
    again from its source with super(<the class that defines it>, self), which is what the test
    means (PyTorch's newer files write super().setUp())."""
    seen: set[type] = set()
    for cls in classes:
        for owner in cls.__mro__:
            if owner in seen or owner.__module__ in ("builtins", "unittest.case"):
                continue
            seen.add(owner)
            for name, fn in list(vars(owner).items()):
                if not inspect.isfunction(fn) or name not in ("setUp", "tearDown"):
                    continue
                try:
                    source = textwrap.dedent(inspect.getsource(fn))
                except (OSError, TypeError):
                    continue
                if SUPER_OF_OWN_CLASS not in source:
                    continue
                scope = dict(fn.__globals__, _owner_class_=owner)
                exec(source.replace(SUPER_OF_OWN_CLASS, "super(_owner_class_, self)"), scope)  # noqa: S102
                setattr(owner, name, scope[name])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _fix_super_of_own_class({item.cls for item in items if getattr(item, "cls", None)})
    skip: set[str] = set()
    path = os.environ.get("PYTORCH_SUITES_DESELECT")
    if path:
        with open(path, encoding="utf-8") as f:
            skip = {line.strip() for line in f if line.strip()}
    device = os.environ.get("PYTORCH_SUITES_DEVICE", "accel")
    patterns = [p for p in os.environ.get("PYTORCH_SUITES_EXCLUDE", "").split(",") if p]

    def keep(item: pytest.Item) -> bool:
        if item.nodeid in skip or not _device_generic(item):
            return False
        return not excluded(item.nodeid, device, patterns)

    kept = [item for item in items if keep(item)]
    deselected = [item for item in items if not keep(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _STARTED[nodeid] = time.perf_counter()
    _RESULTS[nodeid] = {"id": nodeid, "outcome": "passed", "message": ""}
    _write({"start": nodeid})


def _message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        text = str(longrepr[2])
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = str(crash.message) if crash is not None else str(longrepr)
    text = " ".join(text.split())
    return text[:MESSAGE_CHARS]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    result = _RESULTS.setdefault(report.nodeid, {"id": report.nodeid, "outcome": "passed"})
    if report.failed and result["outcome"] != "failed":
        result["outcome"] = "failed"
        where = "" if report.when == "call" else f"[in {report.when}] "
        result["message"] = where + _message(report)
    elif report.skipped and result["outcome"] == "passed":
        # xfail (unittest.expectedFailure) counts as skipped: the test did not pass.
        result["outcome"] = "skipped"
        result["message"] = _message(report)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    result = _RESULTS.pop(nodeid, {"id": nodeid, "outcome": "passed", "message": ""})
    result["seconds"] = round(time.perf_counter() - _STARTED.pop(nodeid, time.perf_counter()), 4)
    _write(result)
    if result["outcome"] == "failed":
        _release_failure()


def _release_failure() -> None:
    """Frees what a failed test's frames still hold.

    pytest keeps the last failure for post-mortem debugging (sys.last_traceback) until the next
    test's call begins, after its setup, and a traceback's frames sit in reference cycles that
    only the cyclic collector frees: a test that ran out of device memory kept its gigabytes
    alive into the next tests (test_pooling's test_maxpool3d_non_square_backward, 64 MiB, ran out
    of the host driver's 4 GiB after test_max_pool3d_ndhwc's failure). The CPU's memory is
    returned the same way, only nobody notices.
    """
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()


def _synchronize() -> None:
    import torch

    torch.accel.synchronize()  # type: ignore[attr-defined]  (registered by torch_accel)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if os.environ.get("PYTORCH_SUITES_DEVICE") != "accel":
        return (yield)
    try:
        result = yield
    except BaseException:
        try:
            _synchronize()
        except Exception:  # noqa: BLE001 (the test failed already; clears the error)
            pass
        raise
    failure = getattr(item, "_excinfo", None)  # a unittest failure, recorded by pytest
    try:
        _synchronize()
    except Exception as e:
        if failure:
            return result  # the test failed already: its own error is the one to report
        raise RuntimeError(f"raised at torch.accel.synchronize() after the test: {e}") from e
    return result
