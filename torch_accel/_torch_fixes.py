"""The one place where torch_accel replaces a piece of PyTorch: a defect of torch 2.11 that no
registration or hook can reach. Each fix names the upstream change that removes it, and
test/test_torch_fixes.py fails once the installed torch no longer needs it.

``Tensor.__dlpack_device__`` (torch/_tensor.py) tells PrivateUse1 tensors by the literal device
type ``"privateuse1"``, which a renamed backend's tensors never have (theirs is ``"accel"``), so
``torch.from_dlpack(t)`` and every DLPack consumer that asks an accel tensor for its device raise
``ValueError: Unknown device type accel for Dlpack``. The C++ side already converts accel tensors
(``kDLExtDev`` and the device index, both ways: ``torch.utils.dlpack.to_dlpack``). The method is
wrapped: accel tensors answer ``(kDLExtDev, index)``, all others go to torch's own method.
Removed by pytorch/pytorch#195815 ("Fix Tensor.__dlpack_device__ never matching renamed
PrivateUse1 backends", open).

``flex_attention`` (torch/nn/attention/flex_attention.py) checks its inputs against a fixed set
of device types (``_validate_device``: cuda, cpu, xpu, hpu) and raises ``ValueError: FlexAttention
is only supported on CUDA, CPU or HPU devices`` for accel, although its eager path (the
flex_attention higher-order operator's math, forward and backward) is made of operators accel
runs. Models that pick it (transformers' ``attn_implementation="flex_attention"``, diffusers'
LTX-2 decoder) stop there. The check is wrapped: accel inputs pass as CUDA's do (backward
included), all others go to torch's own check. PrivateUse1 was asked for in the review of
pytorch/pytorch#148656 (which added hpu to the set); no upstream change makes the set
extensible yet.
"""

from __future__ import annotations

import enum
import functools
import importlib

import torch

_original_dlpack_device = torch.Tensor.__dlpack_device__


@functools.wraps(_original_dlpack_device)
def _dlpack_device(self: torch.Tensor) -> tuple[enum.IntEnum, int]:
    if not torch.overrides.has_torch_function_unary(self) and self.device.type == "accel":
        from torch.utils.dlpack import DLDeviceType

        return (DLDeviceType.kDLExtDev, self.device.index or 0)
    return _original_dlpack_device(self)


_flex = importlib.import_module("torch.nn.attention.flex_attention")
_original_validate_device = _flex._validate_device


@functools.wraps(_original_validate_device)
def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if query.device.type == "accel":
        if torch.compiler.is_compiling():
            # Inductor would lower it with its GPU template (Triton), which the host driver
            # cannot run; the CPU's C++ template is not wired to accel yet.
            raise NotImplementedError(
                "flex_attention under torch.compile is not supported on accel yet; "
                "call it without torch.compile (eager runs it, forward and backward)"
            )
        return  # query, key and value are on one device: checked before
    _original_validate_device(query, key, value)


def install() -> None:
    """Applies the fixes (idempotent). Tensors of other devices see torch's own methods."""
    torch.Tensor.__dlpack_device__ = _dlpack_device  # type: ignore[method-assign]
    _flex._validate_device = _validate_device
