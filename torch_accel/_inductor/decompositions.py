"""Operators accel keeps whole under torch.compile (MTIA's rule for ``native_layer_norm``), and
how accel lowers ``cat`` and sum scatters.

Inductor decomposes ``aten.native_layer_norm`` into pointwise and reduction steps. Accel keeps
the operators listed in ``KEEP_WHOLE`` as one call of accel's own operator instead: their
decomposition returns ``NotImplemented`` for accel inputs (other devices decompose as before),
and a fallback lowering runs the operator itself.

In torch 2.11 this takes two writes to Inductor's global tables (the decomposition entry, and
``make_fallback(..., override_decomp=True)``, without which the implicit fallback asserts "both a
fallback and a decomp for same op"); 2.11 has no per-device decomposition hook
(pytorch/pytorch#175954 proposes one table per compile). They are made once, here, and only
for the listed operators. ``KEEP_WHOLE`` is part of the cache key (passes.py): the FX-graph and
AOTAutograd caches do not see decomposition-table changes.

``cat``: Inductor lowers it into a ``ConcatKernel`` on the CPU and into a pointwise kernel of
masked loads on every other device. The C++ backend miscompiles the latter in 2.11
(``AttributeError: 'str' object has no attribute 'dtype'`` in ``masked``: the backward of
``split``, e.g. any attention block's ``qkv.split``), and the CPU path is what C++ kernels are
tuned for. Accel's ``cat`` lowers as the CPU's: the lowering-table entry is wrapped, other
devices keep theirs.

Sum scatters (``scatter_add``, ``scatter_reduce(..., "sum")``, ``scatter_(..., reduce="add")``;
gather's backward): on the CPU, Inductor runs ATen's kernel for them when its loops run
parallel (``cpp.fallback_scatter_reduce_sum``, a rule written for ``device.type == "cpu"``), and
generates atomic adds elsewhere. In 2.11 the C++ backend's 2D-tiled kernels apply the inner
loop's offset twice to an atomic add's index, writing out of bounds (pytorch/pytorch#191837,
fixed by #191861 after 2.11): DeBERTa's gradients came out wrong on accel, and the CPU without
the rule corrupts its heap. Accel's sum scatters follow the CPU's rule: the lowering-table
entries are wrapped, other devices keep theirs. (``index_put`` with ``accumulate=True`` takes
the atomic path on the CPU as well, and is exposed to the same bug on both.)

Division: Inductor turns a division by a constant into a product with its reciprocal on every
device but the CPU (``div_prim``; the CPU was exempted for precision, pytorch/pytorch#157959),
which rounds differently from eager's quotient in about half of the elements (``x / 448.0``:
71,298 of 131,072 floats one step off, where the CPU's compiled code gives eager's values;
quantization codes computed from such a scale then flip). Accel's C++ kernels are the CPU's
code, so with them (the host driver) a true division stays a division, as eager's and the
CPU's: the lowering-table entries of ``prims.div``, ``aten.div``, ``aten.true_divide`` and
``aten.div.Tensor_mode`` without a rounding mode are wrapped, other devices and Triton kernels
keep Inductor's rule (CUDA's).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# Operators (overload packets of torch.ops.aten) that accel keeps whole; set before the first
# accel compile of the process.
KEEP_WHOLE: tuple[str, ...] = ("native_layer_norm",)

_applied: set[str] = set()


def _keep_for_accel(original: Any) -> Any:
    def decomposition(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and first.device.type == "accel":
            return NotImplemented
        return original(*args, **kwargs)

    decomposition.__name__ = getattr(original, "__name__", "decomposition")
    return decomposition


def apply() -> None:
    """Keeps the operators of KEEP_WHOLE whole on accel, lowers ``cat`` (idempotent)."""
    from torch._inductor import decomposition
    from torch._inductor.lowering import make_fallback

    for name in KEEP_WHOLE:
        if name in _applied:
            continue
        packet = getattr(torch.ops.aten, name)
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            original = decomposition.decompositions.get(overload)
            if original is not None:
                decomposition.decompositions[overload] = _keep_for_accel(original)
        make_fallback(packet, warn=False, override_decomp=True)
        _applied.add(name)
    apply_lowerings()


def _accel_cat(original: Any) -> Any:
    from torch._inductor import ir, lowering
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND

    def cat(inputs: list[Any], dim: int = 0) -> Any:
        device = inputs[0].get_device() if inputs else None
        if device is None or device.type != "accel" or len(inputs) == 1:
            return original(inputs, dim)
        dim = lowering._validate_dim(inputs[0], dim, 0)
        dtype = lowering.get_promoted_dtype(
            *inputs, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
        )
        inputs = [lowering.to_dtype(inp, dtype) for inp in inputs]
        return lowering.TensorBox(ir.ConcatKernel.create(inputs, dim))

    return cat


def _sum_scatter_falls_back(src: Any) -> bool:
    """The CPU's rule for sum scatters (Inductor's use_scatter_fallback), for accel sources."""
    from torch._inductor import config, ir
    from torch._inductor.utils import parallel_num_threads

    if not isinstance(src, ir.TensorBox):
        return False
    device = src.get_device()
    return (
        device is not None
        and device.type == "accel"
        and config.cpp.fallback_scatter_reduce_sum
        and (config.cpp.dynamic_threads or parallel_num_threads() != 1)
    )


def _accel_sum_scatter(original: Any, packet: str) -> Any:
    """Wraps the lowering of ``packet``: ATen's scatter_reduce_ for accel sum scatters."""
    from torch._inductor import ir, lowering

    functional = not packet.endswith("_")

    def scatter(self: Any, dim: int, index: Any, src: Any, *args: Any, **kwargs: Any) -> Any:
        if packet.startswith("scatter_add"):
            reduce = "sum"
        elif packet.startswith("scatter_reduce"):
            reduce = args[0] if args else kwargs.get("reduce", kwargs.get("reduction_type"))
        else:  # scatter_: only its reduce="add" form sums
            reduce = "sum" if kwargs.get("reduce") == "add" else None
        if reduce != "sum" or not _sum_scatter_falls_back(src):
            return original(self, dim, index, src, *args, **kwargs)
        target = lowering.clone(self) if functional else self
        ir.ScatterFallback(
            torch.ops.aten.scatter_reduce_.two,
            target,
            dim,
            index,
            src,
            reduce="sum",
            include_self=kwargs.get("include_self", True),
        )
        return target

    return scatter


_SUM_SCATTERS = ("scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_", "scatter_")


def _wrap_lowerings(packet: str, wrap: Any) -> None:
    """Replaces the lowering of each overload of ``aten.<packet>`` with ``wrap(lowering)``."""
    from torch._inductor import lowering

    op = getattr(torch.ops.aten, packet)
    for name in op.overloads():
        overload = getattr(op, name)
        if overload in lowering.lowerings:
            lowering.lowerings[overload] = wrap(lowering.lowerings[overload])


def _true_division_on_accel_cpp(operands: tuple[Any, ...]) -> bool:
    """Whether a division's operands (IR nodes or numbers) are on accel with C++ kernels."""
    from torch._inductor import ir

    from torch_accel._inductor import kernels

    for x in operands:
        if isinstance(x, ir.IRNode):
            device = x.get_device()
            if device is not None and device.type == "accel":
                return kernels() == "cpp"
    return False


def _accel_division(original: Any, packet: str) -> Any:
    """Wraps the lowering of a true division: on accel with C++ kernels, a quotient (see the
    module's docstring), after the promotions and broadcasting the lowering itself applies."""
    from torch._inductor import lowering
    from torch._inductor.virtualized import ops
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND

    promotion = (
        ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
        if packet == "prims.div"
        else ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT
    )

    def division(a: Any, b: Any, *args: Any, **kwargs: Any) -> Any:
        rounding_mode = kwargs.get("rounding_mode", args[0] if args else None)
        if rounding_mode is not None or not _true_division_on_accel_cpp((a, b)):
            return original(a, b, *args, **kwargs)
        (x, y), _ = lowering.transform_args([a, b], {}, True, promotion, False)
        if all(lowering.is_boolean_type(t) or lowering.is_integer_type(t) for t in (x, y)):
            return original(a, b, *args, **kwargs)  # prims.div of integers: truncation
        x, y = lowering.promote_constants((x, y), type_promotion_kind=promotion)
        return lowering.make_pointwise(lambda u, v: ops.truediv(u, v))(x, y)

    return division


def _wrap_division_lowerings() -> None:
    from torch._inductor import lowering

    for packet in ("div", "true_divide"):
        _wrap_lowerings(packet, functools.partial(_accel_division, packet=packet))
    div = torch.ops.prims.div.default
    lowering.lowerings[div] = _accel_division(lowering.lowerings[div], "prims.div")


def apply_lowerings() -> None:
    """Lowers ``cat``, sum scatters and true divisions on accel as on the CPU (idempotent)."""
    if "cat" not in _applied:
        _wrap_lowerings("cat", _accel_cat)
        _applied.add("cat")
    if "div" not in _applied:
        _wrap_division_lowerings()
        _applied.add("div")
    if "scatter" not in _applied:
        for packet in _SUM_SCATTERS:
            _wrap_lowerings(packet, functools.partial(_accel_sum_scatter, packet=packet))
        _applied.add("scatter")
