"""Assertions shared by the accel test suites."""

from __future__ import annotations

import torch


def assert_same(actual: torch.Tensor, expected: torch.Tensor, exact: bool = True) -> None:
    """An accel result has the CPU reference's values, dtype and shape."""
    assert actual.device.type == "accel", actual.device
    if exact:
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
