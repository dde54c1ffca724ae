"""Moving OpInfo samples to accel and comparing accel's results with the reference's, for
test_opinfo.py's worker: tensors keep their sizes, strides and storage offset on accel, and the
reference's results (the CPU's, or native CUDA's with OPINFO_AGAINST=cuda) are turned into
CUDA's where accel returns CUDA's on purpose."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

import sweep_worker as sweep

ACCEL = torch.device("accel")
# The device accel's results are compared with: the CPU, or native CUDA on the same GPU.
AGAINST = os.environ.get("OPINFO_AGAINST", "cpu")
assert AGAINST in ("cpu", "cuda"), f"OPINFO_AGAINST={AGAINST!r}: use cpu or cuda"


# --- moving samples ----------------------------------------------------------------------------


class UnsupportedSample(Exception):
    """A sample this sweep does not move to accel (a sparse or quantized tensor)."""


def tensor_to_accel(t: torch.Tensor, device: torch.device = ACCEL) -> torch.Tensor:
    """The tensor on accel (or `device`) with the same values, sizes, strides and offset."""
    if t.layout != torch.strided or t.is_quantized:
        raise UnsupportedSample(f"{t.layout} tensor")
    src = t.detach()
    if (src.is_contiguous() and src.storage_offset() == 0) or src.numel() == 0:
        out = src.to(device)
    else:
        # Copies the part of the storage the tensor spans and views it the same way: keeps
        # overlapping (expanded) and non-dense tensors as they are.
        extent = src.storage_offset() + 1
        extent += sum((n - 1) * s for n, s in zip(src.shape, src.stride(), strict=True))
        flat = src.as_strided((extent,), (1,), 0).to(device)
        out = flat.as_strided(src.shape, src.stride(), src.storage_offset())
    return out.requires_grad_(t.requires_grad)


def to_accel(x: Any, device: torch.device = ACCEL) -> Any:
    """A sample's argument on accel (or `device`): tensors moved, CPU device arguments turned
    into that device."""
    if isinstance(x, torch.Tensor):
        return tensor_to_accel(x, device)
    if isinstance(x, torch.device):
        return device if x.type == "cpu" else x
    if isinstance(x, str) and x == "cpu":
        return device.type
    if isinstance(x, list):
        return [to_accel(v, device) for v in x]
    if isinstance(x, tuple):
        values = [to_accel(v, device) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else type(x)(values)
    if isinstance(x, dict):
        return {k: to_accel(v, device) for k, v in x.items()}
    return x


# --- comparing results -------------------------------------------------------------------------


def compare(
    actual: Any, expected: Any, values: bool, path: str = "result", devices: bool = True
) -> None:
    """Raises Mismatch where the accel result `actual` differs from the CPU one `expected`;
    values=False compares types, dtypes and shapes only; devices=False does not check that
    tensors are on accel."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise sweep.Mismatch(f"{path}: {_brief(actual)}, CPU {_brief(expected)}")
        if devices and expected.device.type == AGAINST and actual.device.type != "accel":
            raise sweep.Mismatch(f"{path}: on {actual.device}, expected accel")
        if (actual.dtype, actual.shape, actual.layout) != (
            expected.dtype,
            expected.shape,
            expected.layout,
        ):
            raise sweep.Mismatch(f"{path}: {_brief(actual)}, CPU {_brief(expected)}")
        if values:
            try:
                torch.testing.assert_close(
                    actual.detach().cpu(), expected.detach().cpu(), equal_nan=True
                )
            except AssertionError as e:
                raise sweep.Mismatch(f"{path}: {e}") from None
    elif isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise sweep.Mismatch(f"{path}: {_brief(actual)}, CPU {_brief(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, values, f"{path}[{i}]", devices)
    elif isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise sweep.Mismatch(f"{path}: {_brief(actual)}, CPU {_brief(expected)}")
        for k in expected:
            compare(actual[k], expected[k], values, f"{path}[{k!r}]", devices)
    elif isinstance(expected, float) and isinstance(actual, float):
        close = math.isclose(actual, expected, rel_tol=1.3e-6, abs_tol=1e-5)
        if values and not (close or (math.isnan(actual) and math.isnan(expected))):
            raise sweep.Mismatch(f"{path}: {actual}, CPU {expected}")
    elif type(actual) is not type(expected) or (values and actual != expected):
        raise sweep.Mismatch(f"{path}: {_brief(actual)}, CPU {_brief(expected)}")


def like_cuda(name: str, ref: Any, expected: Any) -> Any:
    """The CPU's results turned into CUDA's where accel returns CUDA's on purpose (README,
    Operators): batch norm's statistics (in eval mode the running mean and 1/sqrt(running var +
    eps) where the CPU returns none; float for half inputs in both modes) and layer norm's
    statistics of a half input (float, where the CPU rounds them to the input's dtype)."""
    x, args = ref.input, ref.args
    half = x.dtype in (torch.float16, torch.bfloat16)
    if name == "_batch_norm_with_update" and half:  # (input, weight, bias, mean, var, ...)
        return (expected[0], expected[1].float(), expected[2].float(), *expected[3:])
    if name in ("native_batch_norm", "_native_batch_norm_legit") and len(args) in (5, 7):
        mean, var = args[2:4] if len(args) == 7 else (None, None)  # (no_stats: none)
        training, eps = args[-3], args[-1]
        if training:
            return (expected[0], expected[1].float(), expected[2].float()) if half else expected
        if mean is None or var is None:
            return expected
        dtype = torch.float32 if half else x.dtype
        return (expected[0], mean.to(dtype), 1 / torch.sqrt(var.to(dtype) + eps))
    if name == "native_layer_norm" and half:
        return (expected[0], expected[1].float(), expected[2].float())
    return expected


def _brief(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"Tensor[{str(x.dtype)[6:]}{list(x.shape)}, {x.device}, {x.layout}]"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {repr(x)[:80]}"
