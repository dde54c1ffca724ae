"""Dynamo's and Inductor's view of the accel device (torch._dynamo.device_interface)."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface


def _accel() -> Any:
    return torch.accel  # type: ignore[attr-defined]


class AccelInterface(DeviceInterface):
    """The accel device for torch.compile: streams, events, devices and their properties."""

    device = torch.accel.device  # type: ignore[attr-defined]
    Event = torch.accel.Event  # type: ignore[attr-defined]
    Stream = torch.accel.Stream  # type: ignore[attr-defined]

    class Worker:
        """What compile workers may ask without starting the device in the parent again."""

        @staticmethod
        def set_device(device: int) -> None:
            _accel().set_device(device)

        @staticmethod
        def current_device() -> int:
            return _accel().current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return _accel().get_device_properties(device)

    @staticmethod
    def current_device() -> int:
        return _accel().current_device()

    @staticmethod
    def set_device(device: torch.types.Device) -> None:
        _accel().set_device(device)

    @staticmethod
    def maybe_exchange_device(device: Any) -> int:
        # Inductor's Triton runtime passes a kernel's DeviceProperties (DeviceGuard); -1: none.
        index = getattr(device, "index", device)
        previous = _accel().current_device()
        if index is not None and index >= 0 and index != previous:
            _accel().set_device(index)
        return previous

    @staticmethod
    def exchange_device(device: Any) -> int:
        return AccelInterface.maybe_exchange_device(device)

    @staticmethod
    def device_count() -> int:
        return _accel().device_count()

    @staticmethod
    def is_available() -> bool:
        return _accel().is_available()

    @staticmethod
    def stream(stream: torch.Stream) -> Any:
        return _accel().stream(stream)

    @staticmethod
    def current_stream() -> torch.Stream:
        return _accel().current_stream()

    @staticmethod
    def set_stream(stream: torch.Stream) -> None:
        _accel().set_stream(stream)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _accel().set_stream(
            torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Only Inductor's Triton autotuner asks (generated code takes device_ops.raw_stream):
        # it times candidate launches on this stream with torch.cuda's events, recorded on
        # torch.cuda's current stream, which is the null stream unless the user set another.
        return 0

    @staticmethod
    def synchronize(device: torch.types.Device = None) -> None:
        _accel().synchronize(device)

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        major, minor = _accel().get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return _accel().is_bf16_supported(including_emulation)

    @staticmethod
    def memory_allocated(device: torch.types.Device = None) -> int:
        return _accel().memory_allocated(device)
