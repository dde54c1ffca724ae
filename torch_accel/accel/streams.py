"""Streams and events of torch.accel: the device-generic torch.Stream and torch.Event."""

from __future__ import annotations

from typing import Any

import torch

from torch_accel.accel._utils import _lazy_device_index

_ACCEL_DEVICE_TYPE = 20  # c10::DeviceType::PrivateUse1, as torch.Stream.device_type reports it


class Stream(torch.Stream):
    """An accel stream: an ordered queue of work on one device.

    ``Stream(device=None, priority=0)`` takes a stream from the device's pool (lower priority
    numbers run first, as in CUDA). ``Stream(stream_id=..., device_index=..., device_type=...)``
    wraps an existing stream.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        index = _lazy_device_index(device)
        return super().__new__(cls, device=torch.device("accel", index), priority=priority)

    @staticmethod
    def _wrap(stream: torch.Stream) -> Stream:
        return Stream(
            stream_id=stream.stream_id,
            device_index=stream.device_index,
            device_type=stream.device_type,
        )

    @property
    def priority(self) -> int:
        """The stream's priority (clamped into ``priority_range()`` when it was made)."""
        from torch_accel import _C

        return _C._stream_priority(self.stream_id, self.device_index)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(least, greatest) priority a stream can have, as torch.cuda.Stream.priority_range:
        lower numbers are higher priorities."""
        from torch_accel import _C

        return tuple(_C._rt.priority_range())

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        """Records ``event`` (a new ``torch.accel.Event`` if None) on this stream; returns it.

        torch.Stream's own record_event takes a torch.Event of exactly that type and refuses
        its subclasses ("expected event to be a torch.Event object"), so a torch.accel.Event
        is recorded through the event, as torch.cuda.Stream does it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.accel.Stream device={self.device} stream_id={self.stream_id}>"


class ExternalStream(Stream):
    """An accel stream over a stream another library created, given by its native handle (an
    int: on the cuda driver a ``cudaStream_t``, e.g. ``torch.cuda.Stream().cuda_stream`` or
    CuPy's; the handle of an accel stream, ``Stream.native_handle``, gives that stream itself).

    Work on it is ordered with accel's own streams through events and ``wait_stream``, as on any
    accel stream. Accel does not own the native stream: keep it alive while the wrapper is in
    use. ``device`` must be the device the stream belongs to (checked where the driver can tell).
    The host driver has no streams but its own, so there only accel streams' handles are taken.
    """

    def __new__(cls, stream_ptr: int, device: Any = None, **kwargs: Any) -> ExternalStream:
        from torch_accel import _C

        index = _lazy_device_index(device)
        stream_id, device_index, device_type = _C._stream_from_external(int(stream_ptr), index)
        return super().__new__(
            cls, stream_id=stream_id, device_index=device_index, device_type=device_type
        )


def get_stream_from_external(data_ptr: int, device: Any = None) -> Stream:
    """The accel stream for a native stream handle another library allocated (see
    ExternalStream): torch.cuda.get_stream_from_external for accel."""
    return ExternalStream(data_ptr, device)


class Event(torch.Event):
    """An accel event, created on the current accel device.

    ``interprocess=True`` makes an event that other processes open, from ``ipc_handle()``
    through ``Event.from_ipc_handle(device, handle)`` or by sending the event itself through
    torch.multiprocessing, and then record, wait on, query and synchronize as their own: all of
    them act on one completion state (``torch.cuda.Event(interprocess=True)``; without timing, as
    CUDA requires). ``blocking`` is accepted for torch.cuda compatibility; synchronizing an accel
    event always blocks the calling thread.
    """

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Event:
        if interprocess and enable_timing:
            raise ValueError(
                "an interprocess accel event cannot time (as with CUDA): create it with "
                "enable_timing=False"
            )
        device = torch.device("accel", _lazy_device_index(None))
        event = super().__new__(cls, device=device, enable_timing=enable_timing)
        if interprocess:
            from torch_accel import _C

            _C._event_adopt_interprocess(event, device.index)
        return event

    @classmethod
    def from_ipc_handle(cls, device: Any, handle: bytes) -> Event:
        """The interprocess event of another process that ``handle`` (its ``ipc_handle()``)
        names, on ``device`` (the device it belongs to)."""
        from torch_accel import _C

        index = _lazy_device_index(device)
        event = super().__new__(cls, device=torch.device("accel", index), enable_timing=False)
        _C._event_adopt_interprocess(event, index, bytes(handle))
        return event

    def ipc_handle(self) -> bytes:
        """The handle another process opens this interprocess event with
        (``Event.from_ipc_handle``)."""
        from torch_accel import _C

        return _C._event_ipc_handle(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled for torch.multiprocessing as its handle, as torch does with CUDA events.
        return (_rebuild_event, (self.device.index, self.ipc_handle()))

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and ``end_event``; both must have completed."""
        from torch_accel import _C

        return _C._event_elapsed_time(self.event_id, end_event.event_id)

    def __repr__(self) -> str:
        return f"<torch.accel.Event device={self.device} event_id={self.event_id}>"


class StreamContext:
    """Context manager that makes ``stream`` (and its device) current; ``None`` does nothing."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._previous_device = -1
        self._previous_stream: torch.Stream | None = None
        self._previous_on_device: torch.Stream | None = None

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        from torch_accel import _C
        from torch_accel.accel import _lazy_init

        _lazy_init()
        index = self.stream.device_index
        self._previous_device = _C._exchange_device(index)
        self._previous_stream = torch.accelerator.current_stream(index)
        if self._previous_device != index:
            self._previous_on_device = torch.accelerator.current_stream(self._previous_device)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        from torch_accel import _C

        assert self._previous_stream is not None
        torch.accelerator.set_stream(self._previous_stream)
        if self._previous_on_device is not None:
            torch.accelerator.set_stream(self._previous_on_device)
        _C._exchange_device(self._previous_device)


def stream(stream: torch.Stream | None) -> StreamContext:
    """``with torch.accel.stream(s):`` runs the block with ``s`` as the current stream."""
    return StreamContext(stream)


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on ``device`` (the current device if None)."""
    return Stream._wrap(torch.accelerator.current_stream(_lazy_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream of ``device`` (stream id 0)."""
    index = _lazy_device_index(device)
    return Stream(stream_id=0, device_index=index, device_type=_ACCEL_DEVICE_TYPE)


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the current stream of its device for the calling thread."""
    from torch_accel.accel import _lazy_init

    _lazy_init()
    torch.accelerator.set_stream(stream)


def _rebuild_event(device: int, handle: bytes) -> Event:
    return Event.from_ipc_handle(device, handle)
