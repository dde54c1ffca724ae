"""The legacy typed storage classes (torch.accel.FloatStorage, ...), as torch.cuda has them.

Tensor.storage_type() and TypedStorage's legacy API look them up by name in the device's module
(torch.storage._get_legacy_storage_class), and find the device from the class's module name:
they live in torch.accel.
"""

from __future__ import annotations

import torch
from torch.storage import _LegacyStorage, _warn_typed_storage_removal


class _AccelLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: not available for accel storage (device memory)")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: not available for accel storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: not available for accel storage")


class _DtypeProperty:
    """A class-level dtype (the legacy classes' `dtype` warns that TypedStorage is deprecated)."""

    def __init__(self, dtype: torch.dtype, warn: bool) -> None:
        self.value, self.warn = dtype, warn

    def __get__(self, instance: object, owner: type) -> torch.dtype:
        if self.warn:
            _warn_typed_storage_removal()
        return self.value


def _make(name: str, dtype: torch.dtype) -> type:
    cls = type(
        name,
        (_AccelLegacyStorage,),
        {"dtype": _DtypeProperty(dtype, True), "_dtype": _DtypeProperty(dtype, False)},
    )
    # TypedStorage finds the device of a legacy class from its module: torch.<device>.
    cls.__module__ = "torch.accel"
    return cls


_STORAGE_DTYPES = {
    "DoubleStorage": torch.double,
    "FloatStorage": torch.float,
    "HalfStorage": torch.half,
    "LongStorage": torch.long,
    "IntStorage": torch.int,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16,
    "ComplexDoubleStorage": torch.cdouble,
    "ComplexFloatStorage": torch.cfloat,
}

STORAGE_CLASSES = {name: _make(name, dtype) for name, dtype in _STORAGE_DTYPES.items()}
_AccelLegacyStorage.__module__ = "torch.accel"
