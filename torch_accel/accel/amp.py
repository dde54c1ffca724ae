"""Automatic mixed precision on accel: torch.accel.amp.autocast and torch.accel.amp.GradScaler.

The autocast policies and operator lists are CUDA's (registered in csrc/device/autocast.cpp).
``torch.autocast("accel", dtype=torch.bfloat16)`` and ``torch.amp.GradScaler("accel")`` work as
they do for CUDA; these names exist for code written against torch.cuda.amp.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GradScaler", "autocast", "get_amp_supported_dtype"]


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes autocast may use on accel."""
    return [torch.float16, torch.bfloat16]


def autocast(
    enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True
) -> torch.autocast:
    """``torch.autocast("accel", ...)`` (dtype float16 by default, as for CUDA): a context
    manager and a decorator. A function rather than a subclass (as torch.cuda.amp.autocast is),
    so that torch.compile traces it as torch.autocast: Dynamo knows torch's autocast classes,
    not their subclasses, and breaks the graph at one."""
    return torch.autocast("accel", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for accel."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("accel", *args, **kwargs)
