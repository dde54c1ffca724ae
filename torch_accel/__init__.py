"""torch_accel: an out-of-tree PyTorch device backend named ``accel``.

``import torch_accel`` (or a plain ``import torch``, through the ``torch.backends`` entry point)
renames PyTorch's PrivateUse1 device to ``accel``, registers the ``torch.accel`` module and adds
``Tensor.accel()``, ``Tensor.is_accel``, ``Module.accel()`` and the storage and PackedSequence
methods. Tensors then live on ``torch.device("accel")``; operators without an accel kernel run
through a visible CPU fallback (``torch.accel.fallback_stats()``).
"""

from __future__ import annotations

import atexit
import os

import torch

_MIN_TORCH = (2, 11)


def _torch_version(text: str) -> tuple[int, int]:
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


if _torch_version(torch.__version__) < _MIN_TORCH:
    raise ImportError(
        f"torch_accel needs torch>={_MIN_TORCH[0]}.{_MIN_TORCH[1]}, but torch "
        f"{torch.__version__} is installed; upgrade torch (pip install 'torch>=2.11')"
    )

from torch_accel import _C  # noqa: E402  (after the version check, on purpose)

__version__: str = _C.__version__
AccelError = _C.AccelError
CaptureError = _C.CaptureError


def _finish_queued_work() -> None:
    """At interpreter exit: lets the work still queued on accel streams run to its end while the
    libraries its kernels call are alive. The C++ static objects of those libraries (oneDNN's
    primitive cache, created at the first convolution, after the runtime started) are destroyed
    before the runtime's streams, whose workers ran a queued convolution through freed code: a
    script that ended after a training step without synchronizing crashed with SIGSEGV. Errors of
    that work, which no call will synchronize on any more, are dropped (as a GPU's are)."""
    if not _C.is_initialized() or _C.in_bad_fork():
        return
    for device in range(_C.device_count()):
        try:
            _C.synchronize(device)
        except Exception:  # noqa: BLE001, S110
            pass


def _register() -> None:
    """Registers the accel device with PyTorch once per process (idempotent)."""
    if getattr(torch, "accel", None) is not None:
        return
    try:
        torch.utils.rename_privateuse1_backend("accel")
    except RuntimeError as e:
        raise ImportError(
            "torch_accel cannot register the 'accel' device: PyTorch's PrivateUse1 device is "
            f"already taken by another backend in this process ({e})"
        ) from e
    mode = os.environ.get("ACCEL_FALLBACK", "")
    if mode not in ("", "warn", "silent", "error"):
        raise ImportError(f"ACCEL_FALLBACK={mode!r} is not one of 'warn', 'silent', 'error'")

    from torch_accel import accel

    atexit.register(_finish_queued_work)
    torch._register_device_module("accel", accel)
    accel.ipc.register_reductions()  # torch.multiprocessing shares accel memory
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    # torch.accelerator.Graph exists from PyTorch 2.12; where the torch accel was built against
    # has it, accel's graphs serve it (2.11: nothing to register).
    _C._register_accelerator_graph()
    # torch.compile: accel registers with Inductor when Inductor's compiler is imported.
    from torch_accel import _import_hook, _inductor

    _inductor.register_after_inductor_import()
    # torchvision's operators under accel's autocast, once torchvision has defined them.
    from torch_accel.accel import amp_torchvision

    _import_hook.after_import("torchvision.ops", amp_torchvision.register)
    # Other libraries' operators with a CPU kernel and a composite one: accel runs the CPU kernel
    # on its memory, as for those with a CPU kernel alone, not the composite (torchaudio's lfilter
    # loop, one small operator per sample otherwise). torchaudio._extension loads its operators;
    # not "torchaudio", which imports torch (and through its autoload torch_accel) before them.
    _import_hook.after_import(
        "torchaudio._extension", lambda: _C._prefer_executor_kernels("torchaudio")
    )
    # torch.accel's device, stream and property functions traced by Dynamo as torch.cuda's.
    from torch_accel._dynamo import polyfills

    _import_hook.after_import("torch._dynamo", polyfills.register)
    # torch.distributed: the accl backend for accel tensors.
    from torch_accel import distributed

    distributed._register()
    # The defects of torch 2.11 no extension point reaches (DLPack, flex_attention, rng_prims).
    from torch_accel import _torch_fixes

    _torch_fixes.install()
    # DTensor's sharding rules for the attention kernel SDPA takes on accel, once DTensor is
    # imported (after _torch_fixes, which they use and whose imports may import DTensor).
    from torch_accel.distributed import tensor_sharding

    _import_hook.after_import("torch.distributed.tensor", tensor_sharding.register)
    # Lightning: the "accel" accelerator and accel's strategies in its registries, once the
    # connectors of Fabric and of the Trainer are imported (they import the registries). Not on
    # "lightning.fabric" or the modules of Fabric and Trainer: those import torch, and with it
    # torch_accel, before they have finished importing.
    from torch_accel import lightning

    lightning.register(_import_hook.after_import)


_register()

__all__ = [
    "AccelError",
    "CaptureError",
    "__version__",
    "device_count",
    "driver",
    "driver_capabilities",
    "executor",
    "driver_selection",
    "get_device_properties",
    "init_error",
    "is_available",
    "runtime_version",
]


def runtime_version() -> str:
    """The version of the accel runtime library this package loaded."""
    return _C.runtime_version()


def device_count() -> int:
    """Number of accel devices; 0 when the runtime cannot start (see :func:`init_error`)."""
    return _C.device_count()


def is_available() -> bool:
    """True when the runtime started and has at least one device."""
    return _C.is_available()


def init_error() -> str:
    """Why the runtime could not start, or ``""``."""
    return _C.init_error()


def driver() -> str:
    """The driver running the devices: ``"host"``, ``"cuda"`` or ``"level_zero"``."""
    return _C.driver_name()


def driver_capabilities() -> dict[str, bool]:
    """What the driver can do: ``graphs``, ``host_functions``, ``timing_events``,
    ``host_accessible_memory``, ``native_handles``, ``virtual_memory`` (expandable segments),
    ``ipc_memory`` (tensors shared with other processes through torch.multiprocessing).
    The runtime refuses what it cannot with an error naming the driver."""
    return _C.driver_capabilities()


def executor() -> tuple[str, str]:
    """Where operators' kernels run on accel memory, and why not when nowhere: ``("host", "")``
    (the CPU's kernels, as stream tasks), ``("cuda", "")`` (CUDA's kernels on the accel stream),
    or ``("none", reason)`` (operators then take the visible CPU fallback)."""
    return _C.executor()


def driver_selection() -> list[tuple[str, str]]:
    """The drivers the runtime considered when it started, in order, each with ``"selected"``
    or ``"skipped: <why>"``: with ``ACCEL_DRIVER=auto``, why the cuda and Level Zero drivers
    were not used (no library in this build, no device, the driver's own error)."""
    return _C.driver_selection()


def get_device_properties(device: int | None = None) -> dict[str, object]:
    """Name, driver, total memory, compute units and capability of a device."""
    return _C.get_device_properties(device)


# accel's own operators (torch.ops.accel.*): fake kernels and autograd (the C++ library, loaded
# with _C, defines them).
from torch_accel import ops  # noqa: E402, F401
