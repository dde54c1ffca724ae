"""Operators accel keeps whole under torch.compile (MTIA's rule for ``native_layer_norm``), and
how accel lowers ``cat``.

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
"""

from __future__ import annotations

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


def apply_lowerings() -> None:
    """Lowers ``cat`` on accel as on the CPU (idempotent)."""
    from torch._inductor import lowering

    if "cat" in _applied:
        return
    for name in torch.ops.aten.cat.overloads():
        overload = getattr(torch.ops.aten.cat, name)
        if overload in lowering.lowerings:
            lowering.lowerings[overload] = _accel_cat(lowering.lowerings[overload])
    _applied.add("cat")
