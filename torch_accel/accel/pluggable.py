"""Device memory from functions the user gives (torch.cuda's pluggable allocators).

An allocator is a pair of C functions, usually from a shared library::

    void* alloc(size_t size, int device, void* stream);
    void free(void* ptr, size_t size, int device, void* stream);

``stream`` is the driver's native handle of the allocating stream (a ``cudaStream_t`` on the
cuda driver, an opaque pointer on the host driver). ``alloc`` returns ``NULL`` when it has no
memory (accel then raises ``torch.OutOfMemoryError``); ``free`` gets back exactly what ``alloc``
gave, once the stream has passed the last use, so it may release the memory at once. Both run
with accel's allocator locked: they must not call into torch or torch_accel.

- ``torch.accel.MemPool(allocator=AccelPluggableAllocator(...))``: the pool's segments come from
  the allocator and accel's caching allocator splits and caches them (as torch.cuda.MemPool with
  an allocator does).
- ``torch.accel.memory.change_current_allocator(allocator)``: every allocation of every accel
  device calls the allocator, uncached, as after torch.cuda's; only before accel has allocated
  any device memory in this process. Memory statistics keep working.
"""

from __future__ import annotations

import ctypes
from typing import Any

from torch_accel import _C

__all__ = ["AccelPluggableAllocator", "change_current_allocator"]


class _AccelAllocator:
    """The functions accel device memory comes from (torch.cuda.memory._CUDAAllocator).
    ``allocator()`` gives their addresses, ``(0, 0)`` for the driver's own."""

    def __init__(self, alloc_fn: int, free_fn: int, owner: Any = None) -> None:
        if (alloc_fn == 0) != (free_fn == 0):
            raise ValueError("an accel allocator needs both an alloc and a free function")
        self._functions = (int(alloc_fn), int(free_fn))
        self._owner = owner  # what keeps the functions loaded (a ctypes library)

    def allocator(self) -> tuple[int, int]:
        return self._functions

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AccelAllocator) and other._functions == self._functions

    def __hash__(self) -> int:
        return hash(self._functions)

    def __repr__(self) -> str:
        if self._functions == (0, 0):
            return "<torch.accel allocator: the driver's>"
        a, f = self._functions
        return f"<torch.accel allocator alloc=0x{a:x} free=0x{f:x}>"


class AccelPluggableAllocator(_AccelAllocator):
    """An allocator loaded from a shared library (torch.cuda.memory.CUDAPluggableAllocator):
    ``alloc_fn_name`` and ``free_fn_name`` name its two functions (signatures in this module's
    documentation)."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        library = ctypes.CDLL(path_to_so_file)
        addresses = []
        for role, name in (("alloc", alloc_fn_name), ("free", free_fn_name)):
            try:
                function = getattr(library, name)
            except AttributeError:
                raise AttributeError(
                    f"AccelPluggableAllocator: {path_to_so_file} has no {role} function {name!r}"
                ) from None
            addresses.append(ctypes.cast(function, ctypes.c_void_p).value)
        super().__init__(addresses[0], addresses[1], owner=library)
        self.path = path_to_so_file


def change_current_allocator(allocator: _AccelAllocator) -> None:
    """Every accel device's memory from ``allocator`` from now on, each allocation through it,
    uncached (torch.cuda.memory.change_current_allocator). A RuntimeError once accel has
    allocated device memory in this process: call it first."""
    if not isinstance(allocator, _AccelAllocator):
        raise TypeError(
            "change_current_allocator expects an accel allocator (AccelPluggableAllocator), "
            f"not {type(allocator).__name__}"
        )
    _C._set_device_allocator(*allocator.allocator())
    _current[0] = allocator


def _get_current_allocator() -> _AccelAllocator:
    """The allocator accel device memory comes from (the driver's unless changed)."""
    functions = tuple(_C._device_allocator())
    if _current[0] is not None and _current[0].allocator() == functions:
        return _current[0]
    return _AccelAllocator(*functions)


_current: list[_AccelAllocator | None] = [None]
