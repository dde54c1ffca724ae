"""Memory management of accel devices (mirrors torch.cuda.memory)."""

from __future__ import annotations

from typing import Any

from torch_accel import _C
from torch_accel.accel._utils import _lazy_device_index

__all__ = [
    "empty_cache",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
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
