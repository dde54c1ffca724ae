"""Device-index helpers of torch.accel (also used by torch.serialization)."""

from __future__ import annotations

from typing import Any

import torch

from torch_accel import _C


def _get_device_index(device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
    """The accel device index meant by ``device``.

    Accepts an int, a string like ``"accel:1"``, a ``torch.device``, a ``torch.accel.device``
    or ``None``. A device without an index (``"accel"``, ``None``) means the current device
    when ``optional`` is true.
    """
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type == "cpu" and allow_cpu:
            return -1
        if device.type != "accel":
            raise ValueError(f"Expected an accel device, but got: {device}")
        index = device.index
    elif device is None:
        index = None
    elif isinstance(device, int):
        index = device
    elif _is_device_context(device):
        return device.idx  # a torch.accel.device, which torch.cuda's functions take too
    else:
        raise ValueError(
            f"Expected an accel device (int, str, torch.device or torch.accel.device), got "
            f"{device!r}"
        )
    if index is None:
        if not optional:
            raise ValueError(f"Expected an accel device with an index, but got: {device}")
        return _C.get_device()
    return index


def _is_device_context(obj: Any) -> bool:
    from torch_accel.accel import device

    return isinstance(obj, device)


def _lazy_device_index(device: Any) -> int:
    """Initializes accel if needed, then the index of ``device`` (the current device for None)."""
    from torch_accel import accel

    accel._lazy_init()
    return _get_device_index(device, optional=True)
