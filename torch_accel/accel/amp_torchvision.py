"""torchvision's operators under ``torch.autocast("accel")``, as under CUDA's autocast.

torchvision registers autocast kernels for its operators per device (CUDA: roi_align, roi_pool,
ps_roi_align, ps_roi_pool, nms, deform_conv2d; the CPU and XPU: roi_align and nms). They run the
operator in float32 and give its result back in the input's dtype. Without them on accel, those
operators got autocast's lower-precision activations next to float32 boxes and weights:
roi_align raised "Expected tensor for argument #1 'input' to have the same type as tensor for
argument #2 'rois'", nms "not implemented for 'BFloat16'", and a Faster R-CNN under accel's
autocast failed. accel registers the same rules, as CUDA's, for ``AutocastPrivateUse1`` through
torch.library, once torchvision is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_KEY = "AutocastPrivateUse1"
# operator: (positions of the tensors run in float32, whether results go back to the input's dtype)
_RULES: dict[str, tuple[tuple[int, ...], bool]] = {
    "roi_align": ((0, 1), True),
    "roi_pool": ((0, 1), True),
    "ps_roi_align": ((0, 1), True),
    "ps_roi_pool": ((0, 1), True),
    "nms": ((0, 1), False),
    "deform_conv2d": ((0, 1, 2, 3, 4), True),
}
_library: torch.library.Library | None = None


def _to_float(value: Any) -> Any:
    # What autocast's cached_cast casts: floating-point accel tensors other than float64.
    if (
        isinstance(value, torch.Tensor)
        and value.device.type == "accel"
        and value.is_floating_point()
        and value.dtype != torch.float64
    ):
        return value.float()
    return value


def _kernel(name: str, positions: tuple[int, ...], cast_back: bool) -> Callable[..., Any]:
    op = getattr(torch.ops.torchvision, name)
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args: Any) -> Any:
        dtype = args[0].dtype
        cast = [_to_float(a) if i in positions else a for i, a in enumerate(args)]
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            result = op(*cast)
        if not cast_back:
            return result
        if isinstance(result, tuple):
            return tuple(r.to(dtype) for r in result)
        return result.to(dtype)

    return kernel


def register() -> None:
    """Registers the kernels (once; torchvision's operators must be defined)."""
    global _library
    if _library is not None or not hasattr(torch.ops, "torchvision"):
        return
    library = torch.library.Library("torchvision", "IMPL")
    for name, (positions, cast_back) in _RULES.items():
        if hasattr(torch.ops.torchvision, name):
            library.impl(name, _kernel(name, positions, cast_back), _KEY)
    _library = library
