"""Range markers for accel, in the style of ``torch.cuda.nvtx``: ``torch.accel.profiler``
(also ``torch.accel.nvtx``).

Ranges are ``torch.profiler`` user annotations (record_function ranges): they show up in
``torch.profiler`` traces and tables, on the thread that opened them, around the operators they
enclose, whose device-side runs appear on the accel stream tracks of the same trace.

    with torch.accel.profiler.range("forward"):
        ...
    torch.accel.profiler.range_push("step"); ...; torch.accel.profiler.range_pop()
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

import torch

__all__ = ["mark", "range", "range_end", "range_pop", "range_push", "range_start"]

_local = threading.local()
_started: dict[int, object] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _stack() -> list[object]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _enter(msg: str) -> object:
    return torch.ops.profiler._record_function_enter_new(msg, None)


def _exit(handle: object) -> None:
    torch.ops.profiler._record_function_exit._RecordFunction(handle)


def range_push(msg: str) -> int:
    """Opens a nested range on this thread; returns its depth (0 for the outermost)."""
    stack = _stack()
    stack.append(_enter(msg))
    return len(stack) - 1


def range_pop() -> int:
    """Closes this thread's innermost range; returns the depth it had, or -1 if none was open."""
    stack = _stack()
    if not stack:
        return -1
    _exit(stack.pop())
    return len(stack)


def range_start(msg: str) -> int:
    """Opens a range that need not nest (another thread may end it); returns its id."""
    handle = _enter(msg)
    with _lock:
        range_id = next(_ids)
        _started[range_id] = handle
    return range_id


def range_end(range_id: int) -> None:
    """Closes the range range_start returned ``range_id`` for."""
    with _lock:
        handle = _started.pop(range_id, None)
    if handle is None:
        raise ValueError(f"no accel profiler range with id {range_id} is open")
    _exit(handle)


def mark(msg: str) -> None:
    """An instant marker (a range of no duration)."""
    _exit(_enter(msg))


@contextlib.contextmanager
def range(msg: str, *args: object, **kwargs: object) -> Iterator[None]:
    """A range around the ``with`` block; ``msg`` is formatted with ``args``/``kwargs``."""
    range_push(msg.format(*args, **kwargs))
    try:
        yield
    finally:
        range_pop()
