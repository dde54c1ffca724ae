"""torch.accel: the accel device module, with the names torch.cuda uses wherever they apply.

Registered as ``torch.accel`` by ``import torch_accel`` (or autoload). Initialization is lazy:
the first call that needs a device starts the runtime; counting devices (``device_count``,
``is_available``) starts nothing, as with torch.cuda. A process forked after the start cannot
use accel (as with CUDA): start subprocesses with the ``spawn`` method instead.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch._utils import _LazySeedTracker

from torch_accel import _C, profiler
from torch_accel.accel import amp, comm, graphs, legacy_tensors, memory, sensors

# Also makes torch.accel._utils an attribute: torch.serialization looks up
# torch.accel._utils._get_device_index.
from torch_accel.accel._utils import _get_device_index, _lazy_device_index
from torch_accel.accel.amp import get_amp_supported_dtype
from torch_accel.accel.graphs import (
    AccelGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from torch_accel.accel.ipc import ipc_collect
from torch_accel.accel.legacy_tensors import *  # noqa: F403 (its __all__ is part of ours)
from torch_accel.accel.memory import *  # noqa: F403 (its __all__ is part of ours)
from torch_accel.accel.random import (
    _get_rng_state_offset,  # noqa: F401 (private, as torch.cuda's, so not in __all__)
    _set_rng_state_offset,  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_accel.accel.sensors import *  # noqa: F403 (its __all__ is part of ours)
from torch_accel.accel.storage import STORAGE_CLASSES
from torch_accel.accel.streams import (
    Event,
    ExternalStream,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    get_stream_from_external,
    set_stream,
    stream,
)

nvtx = profiler  # the name torch.cuda users look for
# What accel raises when it runs out of memory, and for a lost device, under torch.cuda's names.
OutOfMemoryError = torch.OutOfMemoryError
AcceleratorError = torch.AcceleratorError

__all__ = [
    "AcceleratorError",
    "OutOfMemoryError",
    "nvtx",
    "profiler",
    "AccelGraph",
    "graph",
    "graph_pool_handle",
    "graphs",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "Event",
    "ExternalStream",
    "Stream",
    "StreamContext",
    "get_stream_from_external",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "fallback_stats",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_arch_list",
    "get_gencode_flags",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "ipc_collect",
    "is_available",
    "is_bf16_supported",
    "is_tf32_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "reset_fallback_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "set_sync_debug_mode",
    "get_sync_debug_mode",
    "stream",
    "synchronize",
    "amp",
    "comm",
    "get_amp_supported_dtype",
    "memory",
    *memory.__all__,
    *sensors.__all__,
    *legacy_tensors.__all__,
    *STORAGE_CLASSES,
]
globals().update(STORAGE_CLASSES)

_initialized = False  # read by torch.utils.checkpoint
_initialization_lock = threading.Lock()
_tls = threading.local()
default_generators: tuple[torch.Generator, ...] = ()
# Calls that wait for the start (seeding before it), as torch.cuda's: torch.manual_seed must not
# start accel, or DeviceMesh would no longer pick the rank's device and a child forked afterwards
# could not use accel. Of the seeds only the latest manual_seed and manual_seed_all count.
_queued_calls: list[tuple[Callable[[], None], list[str]]] = []
_lazy_seed_tracker = _LazySeedTracker()


class DeferredAccelCallError(Exception):
    """A call queued until accel started (a seed) failed when it ran (torch.cuda's
    DeferredCudaCallError)."""


def _lazy_call(callable: Callable[[], None], seed: bool = False, seed_all: bool = False) -> None:
    """Runs ``callable`` now if accel has started, else right after it starts."""
    with _initialization_lock:
        if is_initialized():
            callable()
        elif seed_all:
            _lazy_seed_tracker.queue_seed_all(callable, traceback.format_stack())
        elif seed:
            _lazy_seed_tracker.queue_seed(callable, traceback.format_stack())
        else:
            _queued_calls.append((callable, traceback.format_stack()))


# --- availability and initialization -----------------------------------------------------


def is_available() -> bool:
    """True when the accel runtime can start and has at least one device."""
    return _C.device_count() > 0


def device_count() -> int:
    """Number of accel devices (0 when the runtime cannot start; see ``_C.init_error()``)."""
    return _C.device_count()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    """True once accel has been initialized in this process (and it was not forked since)."""
    return _initialized and not _is_in_bad_fork()


def _lazy_init() -> None:
    global _initialized, default_generators, _lazy_seed_tracker
    # is_initialized() is False in a forked child, which must reach the error below.
    if is_initialized() or getattr(_tls, "is_initializing", False):
        return
    with _initialization_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize accel in forked subprocess. To use accel with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        _tls.is_initializing = True
        try:
            _C._init()
            default_generators = tuple(
                _C._get_default_generator(i) for i in range(_C.device_count())
            )
            _queued_calls.extend(calls for calls in _lazy_seed_tracker.get_calls() if calls)
            for queued_call, origin in _queued_calls:
                try:
                    queued_call()
                except Exception as e:
                    raise DeferredAccelCallError(
                        f"accel call failed lazily at initialization with error: {e}\n\n"
                        f"accel call was originally invoked at:\n\n{''.join(origin)}"
                    ) from e
            _queued_calls.clear()
            _lazy_seed_tracker = _LazySeedTracker()
            _initialized = True
        finally:
            _tls.is_initializing = False


def init() -> None:
    """Initializes accel now (it otherwise happens on first use)."""
    _lazy_init()


# --- devices --------------------------------------------------------------------------------


def current_device() -> int:
    """Index of the calling thread's current accel device."""
    _lazy_init()
    return _C.get_device()


def set_device(device: Any) -> None:
    """Sets the calling thread's current accel device. A negative index does nothing."""
    index = _get_device_index(device)
    if index >= 0:
        _lazy_init()
        _C.set_device(index)


class device:
    """Context manager that changes the current accel device (``None``/-1: no change)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _get_device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx >= 0:
            _lazy_init()
        self.prev_idx = _C._exchange_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        _C._exchange_device(self.prev_idx)


class device_of(device):
    """Context manager that makes the device of ``obj`` (an accel tensor) current."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.is_accel else -1)


def synchronize(device: Any = None) -> None:
    """Waits for all work on an accel device."""
    _C.synchronize(_lazy_device_index(device))


def _sleep(cycles: int) -> None:
    """Holds the current stream busy for about ``cycles`` nanoseconds (``torch.cuda._sleep``
    spins that many GPU cycles, about as long): work queued after it waits, for tests of
    stream and event order. It is a host task that sleeps; on the cuda driver that also delays
    other streams' host tasks meanwhile (CUDA runs host functions on one thread), where
    torch.cuda's kernel would not."""
    _lazy_init()
    _C._sleep(int(cycles))


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """What an operation that makes the host wait for accel's work does, as
    ``torch.cuda.set_sync_debug_mode``: ``"default"``/0 nothing, ``"warn"``/1 a warning,
    ``"error"``/2 a RuntimeError before it runs. Reported: blocking copies to and from the host,
    ``Tensor.item()`` (and ``bool()``, ``tolist()``), operators whose result shapes depend on the
    data (``nonzero``, boolean masks), the CPU fallback, and operators accel cannot run ahead of
    the host. ``synchronize()`` and ``Stream``/``Event.synchronize()`` are explicit and are not
    reported, nor is the first call of each operator signature (accel computes its result shapes
    then). The setting is process-wide."""
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError(
                f"invalid value of debug_mode {debug_mode!r}, expected one of `default`, "
                "`warn`, `error`"
            )
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError(f"debug_mode must be an int or a str, not {type(debug_mode).__name__}")
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The sync debug mode: 0 (default), 1 (warn) or 2 (error)."""
    return _C._get_sync_debug_mode()


class _AccelDeviceProperties(NamedTuple):
    """What ``get_device_properties`` returns (attributes as torch.cuda's; a named tuple, which
    torch.compile folds into a constant, as it folds torch.cuda's)."""

    name: str
    driver: str
    total_memory: int
    multi_processor_count: int
    major: int
    minor: int
    is_integrated: bool
    max_threads_per_multi_processor: int
    max_kernel_args: int
    max_kernel_buffers: int
    # The device's UUID as torch.cuda's str(properties.uuid) reads (8-4-4-4-12 hex digits; a
    # string, which torch.compile folds as a constant; all zero where the driver has none)
    uuid: str

    def __repr__(self) -> str:
        return (
            f"_AccelDeviceProperties(name='{self.name}', driver='{self.driver}', "
            f"major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid})"
        )


def get_device_properties(device: Any = None) -> _AccelDeviceProperties:
    """Name, driver, memory, compute units and capability of an accel device (``None``: the
    current one). Like ``torch.cuda``, a negative or out-of-range index raises."""
    index = _lazy_device_index(device)
    if index < 0:
        raise _C.AccelError(
            f"get_device_properties: invalid device index {index}: use 0 to "
            f"{device_count() - 1}, or None for the current device"
        )
    p = _C.get_device_properties(index)
    return _AccelDeviceProperties(
        name=p["name"],
        driver=p["driver"],
        total_memory=p["total_memory"],
        multi_processor_count=p["compute_units"],
        major=p["major"],
        minor=p["minor"],
        is_integrated=p["integrated"],
        max_threads_per_multi_processor=p["max_threads_per_compute_unit"],
        max_kernel_args=p["max_kernel_args"],
        max_kernel_buffers=p["max_kernel_buffers"],
        uuid=p["uuid"],
    )


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 works on every accel device (the host driver computes it on the CPU)."""
    return is_available()


def is_tf32_supported() -> bool:
    """Whether float32 matrix products may use TensorFloat-32 (``torch.backends.cuda.matmul``'s
    settings): on the cuda driver as torch.cuda says for the GPU; False where accel's kernels
    run on the host (they compute in float32)."""
    return _on_cuda() and torch.cuda.is_tf32_supported()


def _on_cuda() -> bool:
    """Whether accel's operators run torch's CUDA kernels (the cuda driver's executor)."""
    return _C.executor()[0] == "cuda"


def get_arch_list() -> list[str]:
    """The GPU architectures the kernels accel runs were built for (torch.cuda.get_arch_list):
    torch's CUDA kernels' on the cuda driver; ``[]`` where accel's kernels run on the host."""
    return torch.cuda.get_arch_list() if _on_cuda() else []


def get_gencode_flags() -> str:
    """nvcc's ``-gencode`` flags for :func:`get_arch_list` (torch.cuda.get_gencode_flags); ``""``
    where accel's kernels run on the host."""
    return torch.cuda.get_gencode_flags() if _on_cuda() else ""


# --- the CPU fallback -----------------------------------------------------------------------


def fallback_stats() -> dict[str, int]:
    """How often each operator ran through the copying CPU fallback, by operator name."""
    return _C.fallback_stats()


def reset_fallback_stats() -> None:
    _C.reset_fallback_stats()


def __getattr__(name: str) -> Any:
    # Inductor reads torch.accel.Scheduling (the PrivateUse1 device's code generator) before
    # any accel compile: the first read registers accel with Inductor and Dynamo
    # (torch_accel/_inductor), so that importing torch_accel does not import Inductor.
    if name == "Scheduling":
        from torch_accel._inductor import scheduling

        return scheduling()
    raise AttributeError(f"module 'torch.accel' has no attribute {name!r}")
