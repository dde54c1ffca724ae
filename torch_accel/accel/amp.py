"""Automatic mixed precision on accel: torch.accel.amp.autocast, GradScaler, custom_fwd/custom_bwd.

The autocast policies and operator lists are CUDA's (registered in csrc/device/autocast.cpp).
``torch.autocast("accel", dtype=torch.bfloat16)`` and ``torch.amp.GradScaler("accel")`` work as
they do for CUDA; these names exist for code written against torch.cuda.amp.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import deprecated

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd", "get_amp_supported_dtype"]


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


@deprecated(
    "`torch.accel.amp.custom_fwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_fwd(args..., device_type='accel')` instead.",
    category=FutureWarning,
)
def custom_fwd(fwd: Callable[..., Any] | None = None, *, cast_inputs: torch.dtype | None = None):
    """``torch.amp.custom_fwd(..., device_type="accel")``, deprecated as torch.cuda.amp's is:
    the forward of a custom autograd Function runs under the caller's autocast state (or, with
    ``cast_inputs``, with autocast off and its floating-point accel tensors cast to that
    dtype)."""
    return functools.partial(torch.amp.custom_fwd, device_type="accel")(
        fwd=fwd, cast_inputs=cast_inputs
    )


@deprecated(
    "`torch.accel.amp.custom_bwd(args...)` is deprecated. "
    "Please use `torch.amp.custom_bwd(args..., device_type='accel')` instead.",
    category=FutureWarning,
)
def custom_bwd(bwd: Callable[..., Any]):
    """``torch.amp.custom_bwd(..., device_type="accel")``, deprecated as torch.cuda.amp's is:
    the backward runs under the autocast state its forward ran under."""
    return functools.partial(torch.amp.custom_bwd, device_type="accel")(bwd)
