"""Operators accel keeps whole under torch.compile (MTIA's rule for ``native_layer_norm``).

Inductor decomposes ``aten.native_layer_norm`` into pointwise and reduction steps. Accel keeps
the operators listed in ``KEEP_WHOLE`` as one call of accel's own operator instead: their
decomposition returns ``NotImplemented`` for accel inputs (other devices decompose as before),
and a fallback lowering runs the operator itself.

In torch 2.11 this takes two writes to Inductor's global tables (the decomposition entry, and
``make_fallback(..., override_decomp=True)``, without which the implicit fallback asserts "both a
fallback and a decomp for same op"); 2.11 has no per-device decomposition hook
(pytorch/pytorch#175954 proposes one table per compile). They are made
once, here, and only for the listed operators. ``KEEP_WHOLE`` is part of the cache key
(passes.py): the FX-graph and AOTAutograd caches do not see decomposition-table changes.
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
    """Keeps the operators of KEEP_WHOLE whole on accel (idempotent)."""
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
