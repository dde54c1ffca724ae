"""``torch.compile(model, backend="accel")``: Inductor, with each compiled graph captured into an
AccelGraph and replayed (what ``mode="reduce-overhead"`` does with CUDA graphs; torch 2.11 keeps
that mode to CUDA and silently ignores it on other devices).

Each graph Inductor compiles (the forward, the backward when training, a compiled optimizer
step) runs normally on its first call, is captured on the next call with those input shapes,
and is replayed afterwards:

- Inputs: an input that lives in the outputs of another captured graph (the activations a
  forward graph saved for its backward, the output of the graph before a graph break) is read
  in place, when it is still there at replay; otherwise that call runs uncaptured (or the graph
  captures again, when its producer did). Parameters and buffers (Inductor's other static
  inputs) are read in place; one that moves (reassigned, say) makes the graph capture again,
  and one that moves again, or between the first two calls (gradients set to None every step),
  is copied from then on. Other inputs are copied into the graph's own input buffers, in
  stream order, and copied back after the replay where the graph writes them.
- Outputs: the graph's own output memory, without a copy. Before a replay rewrites it, outputs
  of the previous replay that are still held (a loss kept in a list, the activations of a
  forward whose backward has not run yet, gradients kept as ``.grad``) are moved to new memory
  by a copy, so that every tensor holding them keeps its values (CUDA graph trees raise an
  error on such tensors instead). An output in an input's memory (a forward graph returns the
  parameters its backward needs) is that input's memory again, or a copy where the input was
  copied.

Graphs that cannot be captured run as plain Inductor code, after one log line saying why:
symbolic shapes (``mark_dynamic``), inputs that are not accel tensors (an optimizer's step
counts, unless it is ``capturable``), or work that refuses capture (a synchronizing operation
inside the graph).

Registered through the ``torch_dynamo_backends`` entry point.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

import torch_accel

log = logging.getLogger("torch_accel.compile")

# Graphs compiled with backend="accel" in this process (for tests and benchmarks): captures,
# replays, calls run uncaptured, and outputs moved to new memory before a replay (and bytes).
stats = {
    "captures": 0,
    "replays": 0,
    "uncaptured": 0,
    "uncaptured_calls": 0,
    "moved_outputs": 0,
    "moved_bytes": 0,
}

# Captured graphs, whose outputs later graphs may read in place.
_captured: weakref.WeakSet[_Graphed] = weakref.WeakSet()


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


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _graph_output(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in the outputs of a captured graph."""
    ptr = _storage_ptr(t)
    return any(ptr in g._output_ptrs for g in _captured)


def _place(t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    return t.data_ptr(), t.stride()


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
        self._inputs: list[Any] = []  # copied inputs' buffers (None where read in place)
        self._write_back: list[int] = []  # copied inputs the graph writes
        self._borrowed: dict[int, tuple[int, tuple[int, ...]]] = {}  # input -> captured place
        self._outputs: list[Any] = []
        # Outputs in an input's memory -> that input (None: a copied input; returned as copies).
        self._input_views: dict[int, int | None] = {}
        # Per output storage: a weak reference, its use count while only we hold it, and the
        # index of one of our outputs on it.
        self._held: list[tuple[StorageWeakRef, int, int]] = []
        self._output_ptrs: set[int] = set()
        self._key: tuple[Any, ...] | None = None
        self._static_ptrs: dict[int, int] = {}  # static inputs read in place -> their address
        self._first_ptrs: dict[int, int] = {}  # static inputs' addresses on call 1
        self._moves: dict[int, int] = {}  # static input -> times it moved
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

    def _release(self) -> None:
        if self._graph is not None:
            self._graph.destroy()
        self._graph = None
        self._inputs, self._outputs, self._held = [], [], []
        self._borrowed, self._input_views, self._output_ptrs = {}, {}, set()
        self._static_ptrs = {}
        _captured.discard(self)

    def _capture(self, args: list[Any]) -> None:
        self._release()
        inputs, copied = [], set()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if _graph_output(a):
                    self._borrowed[i] = _place(a)
                elif i not in self._static or self._moves.get(i, 0) >= 2:
                    # Not static, or "static" but moving: the activations a backward graph gets
                    # from a forward that ran uncaptured, gradients set to None every step.
                    a = a.clone()
                    copied.add(i)
                else:
                    self._static_ptrs[i] = a.data_ptr()
            inputs.append(a)
        graph = torch.accel.AccelGraph()  # type: ignore[attr-defined]
        try:
            with torch.accel.graph(graph):  # type: ignore[attr-defined]
                outputs = list(self._compiled(list(inputs)))
        except torch_accel.CaptureError as e:
            graph.destroy()
            self._release()
            self._disable(str(e).split("\n")[0])
            return
        self._graph = graph
        self._key = self._signature(args)
        # Only copied inputs' buffers are ours: holding a borrowed one here would count as a
        # user's hold on its producer's output.
        self._inputs = [a if i in copied else None for i, a in enumerate(inputs)]
        # Copied inputs the graph writes (x.mul_(2)): copied back to the caller's after replay.
        mutated = getattr(self._compiled, "mutated_input_idxs", None)
        self._write_back = sorted(copied if mutated is None else copied & set(mutated))
        # Outputs in an input's memory (a forward returns the parameters its backward needs):
        # over the caller's tensor at replay where the graph reads it in place, else copies.
        input_of = {_storage_ptr(a): i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor)}
        self._input_views = {
            j: (None if input_of[_storage_ptr(o)] in copied else input_of[_storage_ptr(o)])
            for j, o in enumerate(outputs)
            if isinstance(o, torch.Tensor) and _storage_ptr(o) in input_of
        }
        del inputs
        self._outputs = outputs
        self._count_holders()
        _captured.add(self)
        stats["captures"] += 1

    def _count_holders(self) -> None:
        """Records, per storage of our outputs, its reference count while only the graph's own
        output tensors hold it (the count has other parts too: measured, not derived)."""
        first: dict[int, int] = {}  # storage address -> index of the first output on it
        for j, o in enumerate(self._outputs):
            if isinstance(o, torch.Tensor) and j not in self._input_views:
                first.setdefault(_storage_ptr(o), j)
        self._output_ptrs = set(first)
        refs = [(StorageWeakRef(self._outputs[j].untyped_storage()), j) for j in first.values()]
        self._held = [(r, torch._C._storage_Use_Count(r.cdata), j) for r, j in refs]

    def _move_held_outputs(self) -> None:
        """Gives outputs of the previous replay that something still holds new memory, holding
        a copy of their values, before the next replay rewrites the graph's."""
        moved = False
        for ref, ours, first in self._held:
            if torch._C._storage_Use_Count(ref.cdata) <= ours:
                continue
            moved = True
            old = self._outputs[first]
            storage = old.untyped_storage()
            whole = torch.empty(0, dtype=torch.uint8, device=old.device).set_(storage)
            fresh = torch.empty_like(whole)
            fresh.copy_(whole)
            torch_accel._C._swap_storage_memory(whole, fresh)
            # The holders' storage now has the copy; the graph's memory is fresh's: our outputs
            # move to it.
            graph_memory = fresh.untyped_storage()
            rebuilt: dict[int, torch.Tensor] = {}
            for j, o in enumerate(self._outputs):
                if isinstance(o, torch.Tensor) and o.untyped_storage()._cdata == ref.cdata:
                    if id(o) not in rebuilt:
                        rebuilt[id(o)] = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                            graph_memory, o.storage_offset(), o.shape, o.stride()
                        )
                    self._outputs[j] = rebuilt[id(o)]
            stats["moved_outputs"] += 1
            stats["moved_bytes"] += storage.nbytes()
            del whole, fresh, storage, graph_memory, old, rebuilt
        if moved:
            self._count_holders()

    def _statics_moved(self, args: list[Any]) -> bool:
        """Whether a static input read in place moved; counts the moves (one is a parameter
        reassigned, say; two make the input one that is copied)."""
        moved = [i for i, p in self._static_ptrs.items() if args[i].data_ptr() != p]
        for i in moved:
            self._moves[i] = self._moves.get(i, 0) + 1
        return bool(moved)

    def _borrowed_moved(self, args: list[Any]) -> bool:
        return any(_place(args[i]) != place for i, place in self._borrowed.items())

    def __call__(self, args: list[Any]) -> Any:
        self._calls += 1
        if self._calls == 1:
            self._first_ptrs = {
                i: args[i].data_ptr()
                for i in self._static
                if i < len(args) and isinstance(args[i], torch.Tensor)
            }
        elif self._calls == 2:
            for i, p in self._first_ptrs.items():
                if args[i].data_ptr() != p:
                    self._moves[i] = 2  # moved between the first two calls: copy it
        if self._disabled is None and self._calls == 2:
            why = _why_not(args)
            if why is not None:
                self._disable(why)
            else:
                self._capture(args)
        if self._graph is not None and (
            self._statics_moved(args)
            or (self._borrowed_moved(args) and all(_graph_output(args[i]) for i in self._borrowed))
        ):
            # A parameter or buffer now lives elsewhere (reassigned, moved), or the graph that
            # produces the inputs read in place captured again: capture again.
            self._capture(args)
        if self._graph is None or self._signature(args) != self._key or self._borrowed_moved(args):
            if self._graph is not None:
                stats["uncaptured_calls"] += 1
            return self._compiled(args)
        self._move_held_outputs()
        for buffer, a in zip(self._inputs, args, strict=True):
            if buffer is not None:
                buffer.copy_(a)
        sources = {i: args[i] for i in self._input_views.values() if i is not None}
        written = [(args[i], self._inputs[i]) for i in self._write_back]
        args.clear()
        self._graph.replay()
        stats["replays"] += 1
        for caller, buffer in written:
            caller.copy_(buffer)
        del written
        outputs = []
        for j, o in enumerate(self._outputs):
            if isinstance(o, torch.Tensor):
                if j not in self._input_views:
                    o = o.detach()
                elif (i := self._input_views[j]) is None:
                    o = o.clone()
                else:
                    o = torch.empty(0, dtype=o.dtype, device=o.device).set_(
                        sources[i].untyped_storage(), o.storage_offset(), o.shape, o.stride()
                    )
            outputs.append(o)
        return outputs


def accel_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """The ``accel`` Dynamo backend: Inductor plus graph capture and replay.

    ``torch.compile(backend="accel", mode=..., options=...)`` passes its mode and options here
    (to a backend other than Inductor, as keyword arguments): they become Inductor's
    configuration as for ``backend="inductor"``, checked the same way (torch's own wrapper
    reads them: an unknown option is an error naming it)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    if mode is not None or options is not None:
        config = torch._TorchCompileInductorWrapper(mode, options, None).config
        kwargs["config_patches"] = {**config, **(kwargs.get("config_patches") or {})}

    def inner(model: torch.fx.GraphModule, inputs: Sequence[Any], **inner_kwargs: Any) -> Any:
        compiled = compile_fx_inner(model, inputs, **inner_kwargs)
        why = _why_not(inputs)
        backward = bool(inner_kwargs.get("is_backward"))
        # A backward graph's static inputs are the parameters it reads and the activations its
        # forward saved: the latter are read in place from the forward graph's outputs.
        static = inner_kwargs.get("static_input_idxs") or ()
        graphed = _Graphed(compiled, static, "backward graph" if backward else "forward graph")
        if why is not None:
            graphed._disable(why)
        return graphed

    # AOTAutograd's cache would serve Inductor's compiled graphs without calling `inner`, i.e.
    # without capture: it does not key on the inner compiler. Inductor's FX-graph cache (inside
    # compile_fx_inner) still serves the kernels.
    with torch._functorch.config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=inner, **kwargs)
