"""Memory management of accel devices (mirrors torch.cuda.memory).

Statistics use torch.cuda.memory_stats' keys and meanings. ``_record_memory_history``,
``_snapshot`` and ``_dump_snapshot`` produce what ``python -m torch.cuda._memory_viz`` reads
(trace_plot, segment_plot, stats, ...), with Python stack frames per allocation.
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from torch_accel import _C
from torch_accel.accel._utils import _lazy_device_index
from torch_accel.accel.pluggable import (
    AccelPluggableAllocator,
    _AccelAllocator,
    _get_current_allocator,  # noqa: F401 (torch.cuda.memory has it too)
    change_current_allocator,
)
from torch_accel.accel.sensors import list_gpu_processes  # torch.cuda.memory has it too

__all__ = [
    "AccelPluggableAllocator",
    "MemPool",
    "attach_out_of_memory_observer",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "caching_allocator_enable",
    "caching_allocator_enabled",
    "can_device_access_peer",
    "change_current_allocator",
    "device_memory_used",
    "empty_cache",
    "get_allocator_backend",
    "get_per_process_memory_fraction",
    "host_memory_stats",
    "host_memory_stats_as_nested_dict",
    "list_gpu_processes",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_host_memory_stats",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_host_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "use_mem_pool",
]


def memory_stats(device: Any = None) -> dict[str, int]:
    """Caching-allocator statistics of ``device``, with the keys of torch.cuda.memory_stats."""
    return dict(sorted(_C.memory_stats(_lazy_device_index(device)).items()))


def memory_allocated(device: Any = None) -> int:
    """Bytes currently held by tensors on ``device``."""
    return _C.memory_stats(_lazy_device_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or :func:`reset_peak_memory_stats`."""
    return _C.memory_stats(_lazy_device_index(device))["allocated_bytes.all.peak"]


def memory_reserved(device: Any = None) -> int:
    """Bytes the caching allocator holds on ``device`` (allocated plus cached)."""
    return _C.memory_stats(_lazy_device_index(device))["reserved_bytes.all.current"]


def max_memory_reserved(device: Any = None) -> int:
    return _C.memory_stats(_lazy_device_index(device))["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _C.reset_peak_memory_stats(_lazy_device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _C.reset_accumulated_memory_stats(_lazy_device_index(device))


def empty_cache() -> None:
    """Returns the cached, unused memory of every accel device to the driver."""
    from torch_accel import accel

    if accel.is_initialized():
        _C.empty_cache(-2)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of ``device`` as the driver sees them."""
    return _C.mem_get_info(_lazy_device_index(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """Resets the peaks of ``device``'s statistics (as torch.cuda, which does the same)."""
    reset_peak_memory_stats(device)


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"torch.accel.{old} has been renamed to torch.accel.{new}", FutureWarning, stacklevel=3
    )


def memory_cached(device: Any = None) -> int:
    """Deprecated name of :func:`memory_reserved` (torch.cuda's too)."""
    _renamed("memory_cached", "memory_reserved")
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated name of :func:`max_memory_reserved` (torch.cuda's too)."""
    _renamed("max_memory_cached", "max_memory_reserved")
    return max_memory_reserved(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated: resets the peaks of ``device``'s statistics, as torch.cuda's does."""
    _renamed("reset_max_memory_cached", "reset_peak_memory_stats")
    reset_peak_memory_stats(device)


def get_allocator_backend() -> str:
    """The device allocator's name, as torch.cuda's: ``"native"`` (accel's caching allocator),
    or ``"pluggable"`` after :func:`change_current_allocator`."""
    return "native" if _C._device_allocator() == (0, 0) else "pluggable"


def _nested(flat: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """:func:`memory_stats` as nested dictionaries (``["allocated_bytes"]["all"]["current"]``)."""
    return _nested(memory_stats(device))


def _format_bytes(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:6d} {unit}" if unit == "B  " else f"{n:6.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of ``device``'s caching-allocator statistics: current, peak, total allocated and
    total freed, per pool (``abbreviated``: the totals of all pools only)."""
    index = _lazy_device_index(device)
    stats = memory_stats_as_nested_dict(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    width = 83
    lines = [
        "=" * width,
        f" accel memory summary, device {index}".ljust(width),
        "-" * width,
        f"{'Metric':<28}|{'Cur Usage':>13} |{'Peak Usage':>13} |{'Tot Alloc':>11} |"
        f"{'Tot Freed':>11}",
    ]
    for title, key, is_bytes in rows:
        lines.append("-" * width)
        for pool in pools:
            st = stats[key][pool]
            name = title if pool == "all" else f"      from {pool.replace('_', ' ')}"
            fmt = _format_bytes if is_bytes else (lambda v: f"{v:10d}")
            lines.append(
                f"{name:<28}|{fmt(st['current']):>13} |{fmt(st['peak']):>13} |"
                f"{fmt(st['allocated']):>11} |{fmt(st['freed']):>11}"
            )
    lines.append("-" * width)
    for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                "num_device_free"):  # fmt: skip
        lines.append(f"{key:<28}| {stats[key]}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """Records allocation events for :func:`_snapshot` (torch.cuda.memory's signature).

    ``enabled``: ``None`` stops recording, ``"state"`` keeps only which allocation each block
    holds, ``"all"`` also keeps the event trace (at most ``max_entries`` per device). ``context``:
    ``None`` records no stack frames, ``"state"`` those of the allocations a snapshot's blocks
    hold, ``"alloc"`` also those of the trace's events (a free with its allocation's frames),
    ``"all"`` a free with its own. ``stacks``:
    ``"python"`` (Python and TorchScript frames) or ``"all"`` (also C++ frames, slower).
    ``device`` is accepted for compatibility: history is recorded for every accel device.
    """
    from torch_accel.accel import _lazy_init

    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all', not {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all', not {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
    _lazy_init()
    if clear_history:
        _C._record_memory_history(False, False, False, False, 0)
    entries = 0 if enabled == "state" else min(max_entries, 2**62)
    _C._record_memory_history(
        enabled is not None, context is not None, True, stacks == "all", entries, context or "all"
    )


def _snapshot(device: Any = None) -> dict[str, Any]:
    """The allocator's state and recorded history, in torch.cuda.memory._snapshot()'s layout:
    ``segments`` (with their blocks and the frames of each allocation) and ``device_traces``."""
    from torch_accel.accel import _lazy_init

    _lazy_init()
    return _C._memory_snapshot()


def memory_snapshot(
    mempool_id: tuple[int, int] | None = None, include_traces: bool = True
) -> list[dict[str, Any]]:
    """The segments of every accel device's caching allocator (torch.cuda.memory_snapshot);
    with ``mempool_id``, only those of that pool (a :class:`MemPool`'s ``id`` or a graph's
    ``pool()``). ``include_traces`` is accepted for compatibility (traces are not part of the
    segments)."""
    segments = _snapshot()["segments"]
    if mempool_id is None:
        return segments
    pool = tuple(mempool_id)
    return [s for s in segments if tuple(s["segment_pool_id"]) == pool]


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Writes :func:`_snapshot` as a pickle that ``python -m torch.cuda._memory_viz
    trace_plot|segment_plot FILE -o out.html`` turns into PyTorch's interactive viewer."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _save_segment_usage(
    filename: str = "output.svg", snapshot: dict[str, Any] | None = None
) -> None:
    """Draws the segments of ``snapshot`` (default: :func:`_snapshot` now) and their blocks as
    an SVG file, with PyTorch's ``torch.cuda._memory_viz.segments``."""
    from torch.cuda import _memory_viz

    drawing = _memory_viz.segments(_snapshot() if snapshot is None else snapshot)
    with open(filename, "w") as f:
        f.write(drawing)


def _save_memory_usage(
    filename: str = "output.svg", snapshot: dict[str, Any] | None = None
) -> None:
    """Draws the memory in use over the recorded trace of ``snapshot`` (default: now) as an
    SVG file, with PyTorch's ``torch.cuda._memory_viz.memory``."""
    from torch.cuda import _memory_viz

    drawing = _memory_viz.memory(_snapshot() if snapshot is None else snapshot)
    with open(filename, "w") as f:
        f.write(drawing)


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limits what this process's caching allocator may reserve on ``device`` to ``fraction``
    of its memory (enforced: allocations beyond it raise torch.OutOfMemoryError)."""
    if not isinstance(fraction, float) and not isinstance(fraction, int):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(float(fraction), _lazy_device_index(device))


def get_per_process_memory_fraction(device: Any = None) -> float:
    return _C._get_memory_fraction(_lazy_device_index(device))


def _set_allocator_settings(settings: str) -> None:
    """Changes PyTorch's allocator settings (the syntax of PYTORCH_ALLOC_CONF, e.g.
    ``"max_split_size_mb:128,garbage_collection_threshold:0.8"``) and applies them to accel's
    caching allocator, as torch.cuda.memory._set_allocator_settings does for CUDA's. accel reads
    max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold,
    roundup_power2_divisions and expandable_segments (on drivers with virtual memory)."""
    from torch_accel.accel import _lazy_init

    _lazy_init()
    _C._set_allocator_settings(settings)


def caching_allocator_enable(value: bool = True) -> None:
    """Turns the caching allocator on (the default) or off on every accel device, as
    torch.cuda's. Off, each new allocation gets device memory of its own that goes back to the
    driver when the tensor is freed (once the streams using it passed the free), so a read after
    free reaches unmapped memory instead of a recycled block: a debugging aid, slow (the
    ``ACCEL_NO_MEMORY_CACHING=1`` environment variable turns it off from the start, as CUDA's
    ``PYTORCH_NO_CUDA_MEMORY_CACHING``). Tensors allocated before the call keep their way of
    being freed. Graph captures and memory pools keep caching."""
    from torch_accel.accel import _lazy_init

    _lazy_init()
    _C._set_memory_caching(bool(value))


def caching_allocator_enabled(device: Any = None) -> bool:
    """Whether ``device``'s caching allocator caches (see caching_allocator_enable)."""
    return bool(_C._memory_caching(_lazy_device_index(device)))


def attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """Calls ``observer(device, requested_bytes, allocated_bytes, free_bytes)`` whenever an
    accel allocation fails, before torch.OutOfMemoryError is raised (MTIA's API). An observer
    that raises is reported as unraisable; the out-of-memory error still follows."""
    if not callable(observer):
        raise TypeError("attach_out_of_memory_observer: the observer must be callable")
    from torch_accel.accel import _lazy_init

    _lazy_init()
    _C._attach_oom_observer(observer)


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocates ``size`` bytes from the caching allocator on ``device`` for ``stream`` (default:
    its current stream); returns the address. Free it with :func:`caching_allocator_delete`."""
    from torch_accel.accel import current_stream

    index = _lazy_device_index(device)
    if stream is None:
        stream = current_stream(index)
    if not isinstance(stream, torch.Stream) or stream.device.type != "accel":
        raise TypeError("caching_allocator_alloc: stream must be an accel stream")
    if stream.device_index != index:
        raise ValueError(
            f"caching_allocator_alloc: the stream is on accel:{stream.device_index}, the "
            f"allocation on accel:{index}"
        )
    return _C._caching_allocator_alloc(int(size), index, stream.stream_id)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees an allocation of :func:`caching_allocator_alloc`."""
    _C._caching_allocator_delete(int(mem_ptr))


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Whether ``device`` can access ``peer_device``'s memory directly: always on the host
    driver, whose devices share the host's memory."""
    a, b = _lazy_device_index(device), _lazy_device_index(peer_device)
    return a != b and torch.accel.get_device_properties(a).driver == "host"


def device_memory_used(device: Any = None) -> int:
    """Bytes of ``device``'s memory in use, by every process, as nvidia-smi shows them (NVML's
    count on the cuda driver; on the host driver what it has mapped for the device)."""
    return int(_C._device_sensor("memory_used", _lazy_device_index(device)))


def host_memory_stats() -> dict[str, int]:
    """Statistics of the pinned host memory allocator (torch.cuda.host_memory_stats' keys)."""
    return dict(sorted(_C._host_memory_stats().items()))


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    return _nested(host_memory_stats())


def reset_accumulated_host_memory_stats() -> None:
    _C._host_reset_accumulated_stats()


def reset_peak_host_memory_stats() -> None:
    _C._host_reset_peak_stats()


def _release_pool(device: int, pool: tuple[int, int]) -> None:
    try:
        _C._mem_pool_release(device, pool)
    except Exception:  # noqa: BLE001 - at interpreter exit the runtime may be gone already
        pass


class MemPool:
    """A pool of memory of the caching allocator, kept apart from the default pool
    (torch.cuda.MemPool): allocations made inside :func:`use_mem_pool` come from it, and a graph
    captures into it with ``capture_begin(pool=pool.id)``. Its memory goes back to the device when
    the pool and its tensors are gone.

    ``allocator``: an :class:`AccelPluggableAllocator` the pool's segments come from (accel's
    caching allocator splits and caches them; they go back through its free function when the
    pool releases them); None: the device's current allocator. ``use_on_oom``: an allocation
    outside the pool that finds no device memory may use the pool's free blocks. ``no_split``:
    blocks of the pool are never split between allocations.
    """

    def __init__(
        self,
        allocator: _AccelAllocator | None = None,
        use_on_oom: bool = False,
        no_split: bool = False,
    ) -> None:
        if allocator is not None and not isinstance(allocator, _AccelAllocator):
            raise TypeError(
                "torch.accel.MemPool: allocator must be a torch.accel.memory."
                f"AccelPluggableAllocator or None, not {type(allocator).__name__}"
            )
        functions = allocator.allocator() if allocator is not None else (0, 0)
        self._allocator = allocator
        self._device = _lazy_device_index(None)
        self._id: tuple[int, int] = tuple(
            _C._mem_pool_create(self._device, bool(use_on_oom), bool(no_split), *functions)
        )
        self._finalizer = weakref.finalize(self, _release_pool, self._device, self._id)

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id (what graph capture and :func:`memory_snapshot` take)."""
        return self._id

    @property
    def allocator(self) -> _AccelAllocator | None:
        """The allocator given at creation (None: the device's current one)."""
        return self._allocator

    def use_count(self) -> int:
        """How many hold the pool: this object, each active :func:`use_mem_pool`, each graph
        capturing into it or replaying from it."""
        return _C._mem_pool_use_count(self._device, self._id)

    def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
        """The segments of this pool (:func:`memory_snapshot` with this pool's id)."""
        return memory_snapshot(self._id, include_traces=include_traces)

    def __repr__(self) -> str:
        return f"<torch.accel.MemPool id={self._id} device={self._device}>"


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """Within the block, this thread's allocations on ``device`` (default: the current device)
    come from ``pool`` (torch.cuda.use_mem_pool). Other threads, including autograd's backward
    threads, keep allocating from the default pool."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool expects a torch.accel.MemPool, not {type(pool).__name__}")
    index = _lazy_device_index(device)
    _C._mem_pool_begin_allocate(index, pool.id)
    try:
        yield
    finally:
        _C._mem_pool_end_allocate(index, pool.id)
