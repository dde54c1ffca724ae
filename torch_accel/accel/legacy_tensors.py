"""torch.cuda's legacy tensor types for accel: ``torch.accel.FloatTensor`` and its kin.

Old code picks a type by device (``Tensor = torch.cuda.FloatTensor if cuda else
torch.FloatTensor``) and calls it as a constructor or checks ``isinstance`` against it. Each
accel type here builds through torch's own legacy constructor (``Tensor.new``: sizes give an
uninitialized tensor, a sequence its data, on the current accel device) and matches the dense
accel tensors of its dtype. ``tensor.type("torch.accel.FloatTensor")`` takes the name, as torch
knows it; ``tensor.type(torch.accel.FloatTensor)`` does not (torch takes only its own types).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = [
    "BFloat16Tensor",
    "BoolTensor",
    "ByteTensor",
    "CharTensor",
    "DoubleTensor",
    "FloatTensor",
    "HalfTensor",
    "IntTensor",
    "LongTensor",
    "ShortTensor",
]

_warned = False


class _LegacyTensorType(type):
    dtype: torch.dtype
    is_accel = True
    is_cuda = False
    is_sparse = False

    def __instancecheck__(cls, obj: object) -> bool:
        return (
            isinstance(obj, torch.Tensor)
            and obj.device.type == "accel"
            and obj.dtype == cls.dtype
            and obj.layout == torch.strided
        )

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        global _warned
        if not _warned:
            _warned = True
            warnings.warn(
                "The torch.accel.*DtypeTensor constructors are no longer recommended (as "
                "torch.cuda's): use torch.tensor(data, dtype=..., device='accel') or "
                "torch.empty(sizes, dtype=..., device='accel')",
                UserWarning,
                stacklevel=2,
            )
        from torch_accel.accel import current_device

        prototype = torch.empty(0, dtype=cls.dtype, device=torch.device("accel", current_device()))
        return prototype.new(*args, **kwargs)

    def __repr__(cls) -> str:
        return f"<class 'torch.accel.{cls.__name__}'>"


def _make(name: str, dtype: torch.dtype) -> type:
    return _LegacyTensorType(name, (), {"dtype": dtype, "__module__": "torch.accel"})


BFloat16Tensor = _make("BFloat16Tensor", torch.bfloat16)
BoolTensor = _make("BoolTensor", torch.bool)
ByteTensor = _make("ByteTensor", torch.uint8)
CharTensor = _make("CharTensor", torch.int8)
DoubleTensor = _make("DoubleTensor", torch.float64)
FloatTensor = _make("FloatTensor", torch.float32)
HalfTensor = _make("HalfTensor", torch.float16)
IntTensor = _make("IntTensor", torch.int32)
LongTensor = _make("LongTensor", torch.int64)
ShortTensor = _make("ShortTensor", torch.int16)
