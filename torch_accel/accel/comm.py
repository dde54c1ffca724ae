"""torch.accel.comm: copies of one tensor to several accel devices and back, as torch.cuda.comm
does for CUDA devices (what ``torch.nn.DataParallel`` is made of).

``broadcast``, ``broadcast_coalesced``, ``scatter`` and ``gather`` have torch.cuda.comm's
signatures and results: device indices (or ``accel`` devices) name accel devices, a result on
the source's own device is the source itself (``broadcast``) or a view of it (``scatter``), the
copies are asynchronous (stream order, as every accel copy), ``scatter`` copies on the streams it
is given. ``reduce_add`` and ``reduce_add_coalesced`` are torch's own (device-generic).
``torch.nn.parallel.comm`` hands accel tensors to these functions (``torch_accel/_torch_fixes.py``
says why), so ``nn.DataParallel`` runs over accel devices.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors, _handle_complex, _unflatten_dense_tensors
from torch.nn.parallel.comm import reduce_add, reduce_add_coalesced

from torch_accel.accel._utils import _get_device_index

__all__ = [
    "broadcast",
    "broadcast_coalesced",
    "gather",
    "reduce_add",
    "reduce_add_coalesced",
    "scatter",
]

_BUFFER_SIZE = 10485760  # torch.cuda.comm's default bucket size, in bytes


def _device(index: int) -> torch.device:
    if index < 0:
        raise RuntimeError(f"Expected non-negative device index, but got {index}")
    return torch.device("accel", index)


def _indices(devices: Iterable[Any]) -> list[int]:
    return [_get_device_index(d) for d in devices]


def _check_accel(tensor: torch.Tensor, what: str, i: int) -> None:
    if tensor.device.type != "accel":
        raise RuntimeError(
            f"Expected all {what} tensors to be accel tensors, but {what} tensor at index {i} "
            f"has device '{tensor.device}'"
        )


def _one_of(devices: object, out: object) -> None:
    if (devices is None) == (out is None):
        raise RuntimeError(
            "Exactly one of 'devices' and 'out' must be specified, but got "
            f"devices={devices} and out={out}"
        )


def broadcast(
    tensor: torch.Tensor,
    devices: Iterable[Any] | None = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Copies ``tensor`` (accel or CPU) to each of ``devices`` (the tensor itself where it is
    already there), or into the accel tensors ``out``."""
    tensor = _handle_complex(tensor)
    _one_of(devices, out)
    if out is not None:
        for i, o in enumerate(out):
            _check_accel(o, "output", i)
            if o.shape != tensor.shape:
                raise RuntimeError(
                    "Expected all output tensors to have same shape as the source tensor "
                    f"{list(tensor.shape)}, but output tensor at index {i} has shape "
                    f"{list(o.shape)}"
                )
        for o in out:
            o.copy_(tensor, non_blocking=True)
        return tuple(out)
    assert devices is not None
    source = tensor.get_device() if tensor.device.type == "accel" else None
    results = []
    for index in _indices(devices):
        if index == source:
            results.append(tensor)
            continue
        if tensor.is_sparse:
            results.append(tensor.to(_device(index), copy=True))
            continue
        copy = torch.empty(tensor.shape, dtype=tensor.dtype, device=_device(index))
        results.append(copy.copy_(tensor, non_blocking=True))
    return tuple(results)


def _buckets(tensors: Sequence[torch.Tensor], buffer_size: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped as torch.cuda.comm groups them: sparse ones alone, dense
    ones by dtype into buckets of at most ``buffer_size`` bytes (a larger tensor alone)."""
    buckets: list[list[int]] = []
    open_: dict[torch.dtype, tuple[list[int], int]] = {}
    for i, t in enumerate(tensors):
        if t.is_sparse:
            buckets.append([i])
            continue
        size = t.numel() * t.element_size()
        indices, used = open_.get(t.dtype, ([], 0))
        if indices and used + size > buffer_size:
            buckets.append(indices)
            indices, used = [], 0
        indices.append(i)
        open_[t.dtype] = (indices, used + size)
    buckets.extend(indices for indices, _ in open_.values() if indices)
    return buckets


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: Iterable[Any], buffer_size: int = _BUFFER_SIZE
) -> list[list[torch.Tensor]]:
    """Copies ``tensors`` (all on ``devices[0]``) to every device, a bucket of up to
    ``buffer_size`` bytes per copy; returns a list of tensors per device, the first being
    ``tensors`` themselves. The copies share their bucket's memory and have no autograd
    history."""
    indices = _indices(devices)
    if not indices:
        raise RuntimeError("Expected at least one device to broadcast to")
    tensors = [_handle_complex(t) for t in tensors]
    for i, t in enumerate(tensors):
        if t.device.type != "accel" or t.get_device() != indices[0]:
            raise RuntimeError(
                f"All tensors must be on devices[0] (accel:{indices[0]}), but tensor {i} is on "
                f"{t.device}"
            )
    outputs: list[list[torch.Tensor | None]] = [list(tensors)]
    outputs += [[None] * len(tensors) for _ in indices[1:]]
    for bucket in _buckets(tensors, buffer_size):
        chunk = [tensors[i] for i in bucket]
        if chunk[0].is_sparse:
            copies = broadcast(chunk[0], indices)
            for d in range(1, len(indices)):
                outputs[d][bucket[0]] = copies[d].data
            continue
        flat = broadcast(_flatten_dense_tensors(chunk), indices)
        for d in range(1, len(indices)):
            for i, t in zip(bucket, _unflatten_dense_tensors(flat[d], chunk), strict=True):
                outputs[d][i] = t.data  # its own version counter, as CUDA's
    return outputs  # type: ignore[return-value]


def _check_stream(stream: torch.Stream, i: int, index: int) -> None:
    if stream.device.type != "accel" or stream.device_index != index:
        raise RuntimeError(
            f"Expected the device associated with the stream at index {i} (was "
            f"{stream.device}) to match the device supplied at that index (expected "
            f"accel:{index})"
        )


def _copy_on(stream: torch.Stream | None, copy: Any) -> torch.Tensor:
    if stream is None:
        return copy()
    from torch_accel import accel

    with accel.stream(stream):  # type: ignore[arg-type]
        return copy()


def scatter(
    tensor: torch.Tensor,
    devices: Iterable[Any] | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Sequence[torch.Stream | None] | None = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Splits ``tensor`` along ``dim`` (evenly as ``Tensor.chunk`` does, or by ``chunk_sizes``)
    and copies chunk ``i`` to ``devices[i]`` (a view where the tensor already is), on
    ``streams[i]`` when given; or splits it into the accel tensors ``out``."""
    tensor = _handle_complex(tensor)
    _one_of(devices, out)
    stream_list = list(streams) if streams is not None else []
    if out is not None:
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'devices' must not be specified when 'out' is specified, but got "
                f"chunk_sizes={chunk_sizes}"
            )
        return _scatter_out(tensor, list(out), dim, stream_list)
    indices = _indices(devices)  # type: ignore[arg-type]
    if not indices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None and len(chunk_sizes) != len(indices):
        raise RuntimeError(
            "Expected devices and chunk_sizes to be of same length, but got "
            f"len(devices) = {len(indices)} and len(chunk_sizes) = {len(chunk_sizes)}"
        )
    chunks = (
        tensor.split(list(chunk_sizes), dim)
        if chunk_sizes is not None
        else tensor.chunk(len(indices), dim)
    )
    source = tensor.get_device() if tensor.device.type == "accel" else None
    results = []
    for i, chunk in enumerate(chunks):
        index = indices[i]
        if index == source:
            results.append(chunk)
            continue
        device = _device(index)
        stream = stream_list[i] if i < len(stream_list) else None
        if stream is not None:
            _check_stream(stream, i, index)
        results.append(
            _copy_on(
                stream,
                lambda c=chunk, d=device: c.to(
                    d, non_blocking=True, memory_format=torch.preserve_format
                ),
            )
        )
    return tuple(results)


def _scatter_out(
    tensor: torch.Tensor, out: list[torch.Tensor], dim: int, streams: list[torch.Stream | None]
) -> tuple[torch.Tensor, ...]:
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = dim % tensor.dim() if tensor.dim() else 0
    sizes = []
    for i, o in enumerate(out):
        _check_accel(o, "output", i)
        expected = list(tensor.shape)
        if o.dim() == tensor.dim():
            expected[dim] = o.shape[dim]
        if list(o.shape) != expected:
            raise RuntimeError(
                f"Output tensor at index {i} has incorrect shape: {list(o.shape)}. Expected same "
                f"shape except for scatter dim {dim} as the source tensor: {list(tensor.shape)}"
            )
        sizes.append(o.shape[dim])
    if sum(sizes) != tensor.shape[dim]:
        raise RuntimeError(
            f"Total size for output tensors along scatter dim {dim} does not match the source "
            f"tensor size at dim {dim}. Expected {tensor.shape[dim]}, but got total size "
            f"{sum(sizes)}"
        )
    for i, (o, chunk) in enumerate(zip(out, tensor.split(sizes, dim), strict=True)):
        stream = streams[i] if i < len(streams) else None
        if stream is not None:
            _check_stream(stream, i, o.get_device())
        _copy_on(stream, lambda o=o, c=chunk: o.copy_(c, non_blocking=True))
    return tuple(out)


def _gathered_shape(tensors: Sequence[torch.Tensor], dim: int) -> tuple[list[int], int]:
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = dim % first.dim() if first.dim() else 0
    expected = list(first.shape)
    total = 0
    for i, t in enumerate(tensors):
        _check_accel(t, "input", i)
        if t.dim() != len(expected):
            raise RuntimeError(
                "Expected all input tensors to have the same number of dimensions, but tensor "
                f"at index {i} has {t.dim()} dimensions, (expected {len(expected)})"
            )
        expected[dim] = t.shape[dim]
        if list(t.shape) != expected:
            raise RuntimeError(
                f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected "
                f"{expected}"
            )
        total += t.shape[dim]
    expected[dim] = total
    return expected, dim


def _memory_format(t: torch.Tensor) -> torch.memory_format:
    """The layout a gathered result keeps (channels-last where every input is)."""
    if t.is_contiguous():
        return torch.contiguous_format
    for fmt, dims in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if t.dim() == dims and t.is_contiguous(memory_format=fmt):
            return fmt
    return torch.contiguous_format


def _destination(destination: Any) -> torch.device:
    index = _get_device_index(destination, optional=True, allow_cpu=True)  # -1: the CPU
    return torch.device("cpu") if index == -1 else _device(index)


def gather(
    tensors: Sequence[torch.Tensor],
    dim: int = 0,
    destination: Any = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenates the accel ``tensors`` along ``dim`` on ``destination`` (an accel device, the
    current one for None, ``"cpu"`` or -1 for the CPU), or into ``out``."""
    tensors = [_handle_complex(t) for t in tensors]
    shape, dim = _gathered_shape(tensors, dim)
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                "'destination' must not be specified when 'out' is specified, but got "
                f"destination={destination}"
            )
        if list(out.shape) != shape:
            raise RuntimeError(
                f"Expected out tensor to have shape {shape}, but got {list(out.shape)}"
            )
        target = out
    else:
        if destination == -1:
            warnings.warn(
                "Using -1 to represent CPU tensor is deprecated. Please use a device object or "
                "string instead, e.g., 'cpu'.",
                FutureWarning,
                stacklevel=2,
            )
        device = _destination(destination)
        formats = {_memory_format(t) for t in tensors}
        fmt = formats.pop() if len(formats) == 1 else torch.contiguous_format
        target = torch.empty(shape, dtype=tensors[0].dtype, device=device, memory_format=fmt)
    parts = target.split([t.shape[dim] for t in tensors], dim)
    for part, t in zip(parts, tensors, strict=True):
        part.copy_(t, non_blocking=target.device.type == "accel")
    return target
