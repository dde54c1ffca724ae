"""``torch.compile(model, backend="accel")``: Inductor, with each compiled graph captured into an
AccelGraph and replayed (what ``mode="reduce-overhead"`` does with CUDA graphs; torch 2.11 keeps
that mode to CUDA and silently ignores it on other devices).

Each graph Inductor compiles (the forward, and the backward when training) runs normally on its
first call, then is captured on the next call with those input shapes and replayed afterwards:
inputs that are not static (parameters and buffers are) are copied into the graph's input
buffers, in stream order, and the outputs are returned as copies (a later replay rewrites the
graph's own output memory, which a caller may still hold: saved activations, say). Graphs that
cannot be captured run as plain Inductor code, after one log line saying why: symbolic shapes
(``mark_dynamic``), inputs that are not accel tensors, or work that refuses capture (a
synchronizing operation inside the graph).

Registered through the ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

import torch_accel

log = logging.getLogger("torch_accel.compile")

# Replays and captures of graphs compiled with backend="accel" in this process (for tests and
# benchmarks): {"captures": n, "replays": n, "uncaptured": n}.
stats = {"captures": 0, "replays": 0, "uncaptured": 0}


def _why_not(inputs: Sequence[Any]) -> str | None:
    for i, x in enumerate(inputs):
        if isinstance(x, torch.SymInt):
            return f"input {i} is a symbolic size (dynamic shapes)"
        if isinstance(x, torch.Tensor):
            if x.device.type != "accel":
                return f"input {i} is on {x.device}, not accel"
            if any(isinstance(s, torch.SymInt) for s in (*x.shape, *x.stride())):
                return f"input {i} has a symbolic shape (dynamic shapes)"
    return None


class _Graphed:
    """An Inductor-compiled graph (boxed calling convention) replayed from an AccelGraph."""

    def __init__(self, compiled: Any, static_input_idxs: Sequence[int], name: str) -> None:
        # An instance attribute: wrappers (functools.wraps) copy __dict__, and Inductor's callers
        # use the boxed convention only where they find it.
        self._boxed_call = True
        self._compiled = compiled
        self._static = set(static_input_idxs)
        self._name = name
        self._calls = 0
        self._graph: torch.accel.AccelGraph | None = None  # type: ignore[name-defined]
        self._inputs: list[Any] = []
        self._outputs: list[Any] = []
        self._key: tuple[Any, ...] | None = None
        self._static_ptrs: dict[int, int] = {}
        self._disabled: str | None = None

    def _disable(self, why: str) -> None:
        self._disabled = why
        stats["uncaptured"] += 1
        log.warning("backend='accel': %s runs without graph capture: %s", self._name, why)

    @staticmethod
    def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
            for a in args
        )

    def _capture(self, args: list[Any]) -> None:
        self._inputs = [
            a if (i in self._static or not isinstance(a, torch.Tensor)) else a.clone()
            for i, a in enumerate(args)
        ]
        graph = torch.accel.AccelGraph()  # type: ignore[attr-defined]
        try:
            with torch.accel.graph(graph):  # type: ignore[attr-defined]
                self._outputs = list(self._compiled(list(self._inputs)))
        except torch_accel.CaptureError as e:
            graph.destroy()
            self._inputs, self._outputs = [], []
            self._disable(str(e).split("\n")[0])
            return
        self._graph = graph
        self._key = self._signature(args)
        self._static_ptrs = {
            i: a.data_ptr()
            for i, a in enumerate(args)
            if i in self._static and isinstance(a, torch.Tensor)
        }
        stats["captures"] += 1

    def _statics_moved(self, args: list[Any]) -> bool:
        return any(args[i].data_ptr() != p for i, p in self._static_ptrs.items())

    def __call__(self, args: list[Any]) -> Any:
        self._calls += 1
        if self._disabled is None and self._calls == 2:
            why = _why_not(args)
            if why is not None:
                self._disable(why)
            else:
                self._capture(args)
        if self._graph is not None and self._statics_moved(args):
            # A parameter or buffer now lives elsewhere (reassigned, moved): capture again.
            self._graph.destroy()
            self._graph = None
            self._capture(args)
        if self._graph is None or self._signature(args) != self._key:
            return self._compiled(args)
        for i, a in enumerate(args):
            if i not in self._static and isinstance(a, torch.Tensor):
                self._inputs[i].copy_(a)
        args.clear()
        self._graph.replay()
        stats["replays"] += 1
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in self._outputs]


def accel_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The ``accel`` Dynamo backend: Inductor plus graph capture and replay."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(model: torch.fx.GraphModule, inputs: Sequence[Any], **inner_kwargs: Any) -> Any:
        compiled = compile_fx_inner(model, inputs, **inner_kwargs)
        why = _why_not(inputs)
        backward = bool(inner_kwargs.get("is_backward"))
        # Static inputs of a backward graph include activations saved by the forward, which
        # live in new memory every step here (forward outputs are copies): copy them all.
        static = () if backward else (inner_kwargs.get("static_input_idxs") or ())
        graphed = _Graphed(compiled, static, "backward graph" if backward else "forward graph")
        if why is not None:
            graphed._disable(why)
        return graphed

    # AOTAutograd's cache would serve Inductor's compiled graphs without calling `inner`, i.e.
    # without capture: it does not key on the inner compiler. Inductor's FX-graph cache (inside
    # compile_fx_inner) still serves the kernels.
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner, **kwargs)
