"""Graph capture and replay on accel (mirrors torch.cuda.graphs).

Work issued on a capturing stream is recorded into an :class:`AccelGraph` instead of running;
``replay()`` runs all of it again, as one submission, on the same memory: tensors created during
the capture come from the graph's private memory pool and keep their addresses, so every replay
rewrites them. Work that cannot be recorded (a value read on the host with ``.item()``, a copy to
pageable host memory, an operator whose result shape depends on the data, the CPU fallback,
``torch.accel.synchronize()``) raises :class:`torch_accel.CaptureError` at the call, naming it;
the capture is then invalidated, and ending it leaves the stream usable.
"""

from __future__ import annotations

import gc
import threading
import warnings
import weakref
from types import TracebackType
from typing import Any

import torch

from torch_accel import _C
from torch_accel.accel.streams import Stream, current_stream
from torch_accel.accel.streams import stream as stream_context

__all__ = [
    "AccelGraph",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
]

_MODES = ("global", "thread_local", "relaxed")


def graph_pool_handle() -> tuple[int, int]:
    """A memory pool id several graphs can capture into (``capture_begin(pool=...)``), so they
    share memory: replay them in the order they were captured."""
    from torch_accel.accel import _lazy_init

    _lazy_init()
    return _C._graph_pool_handle()


def is_current_stream_capturing() -> bool:
    """True if the current stream of the current accel device is capturing a graph."""
    from torch_accel.accel import is_initialized

    if not is_initialized():
        return False
    s = current_stream()
    return _C._stream_capture_status(s.device_index, s.stream_id) == "active"


def _destroy(handle: int) -> None:
    try:
        _C._graph_destroy(handle)
    except Exception:  # noqa: BLE001 - at interpreter exit the runtime may be gone already
        pass


class AccelGraph:
    """A captured sequence of accel work that can be replayed (torch.cuda.CUDAGraph's API).

    ``keep_graph`` is accepted for torch.cuda compatibility: accel keeps what it captured until
    :meth:`reset` or :meth:`destroy` either way, and instantiates it at :meth:`capture_end`
    unless ``keep_graph`` is True (then at :meth:`instantiate` or the first :meth:`replay`).
    """

    def __init__(self, keep_graph: bool = False) -> None:
        from torch_accel.accel import _lazy_init

        _lazy_init()
        self._handle: int | None = _C._graph_create()
        self._keep_graph = keep_graph
        self._debug = False
        self._device: int | None = None
        self._finalizer = weakref.finalize(self, _destroy, self._handle)

    def _live(self, call: str) -> int:
        if self._handle is None:
            raise RuntimeError(f"AccelGraph.{call}: the graph was destroyed; create a new one")
        return self._handle

    def capture_begin(
        self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global"
    ) -> None:
        """Starts capturing the current stream (not a device's default stream: use a side stream,
        as :class:`graph` does). ``pool``: a :func:`graph_pool_handle` or another graph's
        :meth:`pool` to share its memory. ``capture_error_mode``: ``"global"`` (a synchronizing
        call from any thread fails), ``"thread_local"`` (from this thread only) or ``"relaxed"``.
        """
        if capture_error_mode not in _MODES:
            raise ValueError(
                f"capture_error_mode must be one of {', '.join(_MODES)}, not {capture_error_mode!r}"
            )
        handle = self._live("capture_begin")
        s = current_stream()
        _C._graph_capture_begin(
            handle, s.device_index, s.stream_id, tuple(pool or (0, 0)), capture_error_mode
        )
        self._device = s.device_index

    def register_generator_state(self, generator: torch.Generator) -> None:
        """torch.cuda.CUDAGraph's registration of a generator other than the default one, so that
        its draws in the graph change on every replay. Accel's graphs do that for every accel
        generator drawn during a capture, registered or not; this checks ``generator`` is one of
        the graph's device (or of any accel device before the capture)."""
        if not isinstance(generator, torch.Generator) or generator.device.type != "accel":
            where = generator.device if isinstance(generator, torch.Generator) else generator
            raise TypeError(
                f"register_generator_state expects an accel torch.Generator, got {where!r}"
            )
        self._live("register_generator_state")
        if self._device is not None and generator.device.index != self._device:
            raise ValueError(
                f"register_generator_state: the generator belongs to {generator.device}, the "
                f"graph to accel:{self._device}"
            )

    def capture_end(self) -> None:
        """Ends the capture. Raises torch_accel.CaptureError if it was invalidated (naming the
        call that did it); the stream is usable again either way."""
        handle = self._live("capture_end")
        _C._graph_capture_end(handle)
        if _C._graph_node_count(handle) == 0:
            # As torch.cuda's: most often the work went to another stream or device.
            warnings.warn(
                "The accel graph is empty. This usually means that the graph was attempted to "
                "be captured on the wrong device or stream.",
                UserWarning,
                stacklevel=2,
            )
        if not self._keep_graph:
            _C._graph_instantiate(handle)

    def instantiate(self) -> None:
        """Prepares the captured work for replay (``replay`` does it if needed)."""
        _C._graph_instantiate(self._live("instantiate"))

    def replay(self) -> None:
        """Runs the captured work on the current stream of the graph's device."""
        handle = self._live("replay")
        s = current_stream(self._device)
        _C._graph_replay(handle, s.device_index, s.stream_id)

    def reset(self) -> None:
        """Drops the captured work and the graph's hold on its memory pool (the memory returns
        to the allocator once no tensor uses it); the graph can capture again."""
        _C._graph_reset(self._live("reset"))

    def pool(self) -> tuple[int, int]:
        """The id of the graph's memory pool, for another capture to share
        (``capture_begin(pool=g.pool())``)."""
        return _C._graph_pool(self._live("pool"))

    def destroy(self) -> None:
        """Frees the graph and what it captured now (garbage collection does it otherwise); any
        later use raises."""
        if self._handle is not None:
            self._finalizer.detach()
            handle, self._handle = self._handle, None
            _C._graph_destroy(handle)

    def num_nodes(self) -> int:
        """How many pieces of work the capture recorded."""
        return _C._graph_node_count(self._live("num_nodes"))

    def enable_debug_mode(self) -> None:
        """Keeps what the capture recorded available to :meth:`debug_dump` (as on CUDA, a dump
        needs debug mode or ``keep_graph=True``)."""
        self._live("enable_debug_mode")
        self._debug = True

    def debug_dump(self, debug_path: str) -> None:
        """Writes the recorded work (one node per operator, copy, fill or random-state step)
        and its dependencies as a Graphviz dot file: ``dot -Tsvg PATH -o graph.svg`` draws it.
        Work captured on several streams shows as parallel branches."""
        handle = self._live("debug_dump")
        if not (self._debug or self._keep_graph):
            raise RuntimeError(
                "AccelGraph.debug_dump: debug mode is off; call enable_debug_mode() before "
                "the capture (or create the graph with keep_graph=True)"
            )
        _C._graph_debug_dump(handle, str(debug_path))

    def __repr__(self) -> str:
        state = "destroyed" if self._handle is None else f"device={self._device}"
        return f"<torch.accel.AccelGraph {state}>"


class graph:  # noqa: N801 - torch.cuda.graph's name
    """Context manager that captures the work of its body into ``accel_graph``.

    Like torch.cuda.graph: it synchronizes the device, frees cached memory, and captures on
    ``stream`` (default: a side stream per device, shared by every ``graph``) with ``pool`` and
    ``capture_error_mode`` passed to :meth:`AccelGraph.capture_begin`. If the body raises, the
    capture ends quietly (its error is the one that propagates) and the graph is reset.
    """

    _default_streams: dict[int, Stream] = {}
    _lock = threading.Lock()

    def __init__(
        self,
        accel_graph: AccelGraph,
        pool: tuple[int, int] | None = None,
        stream: torch.Stream | None = None,
        capture_error_mode: str = "global",
    ) -> None:
        from torch_accel.accel import current_device

        if stream is None:
            device = current_device()
            with graph._lock:
                stream = graph._default_streams.setdefault(device, Stream(device))
        self.accel_graph = accel_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx: Any = None

    def __enter__(self) -> None:
        from torch_accel.accel import empty_cache, synchronize

        synchronize()
        gc.collect()
        empty_cache()
        self._stream_ctx = stream_context(self.capture_stream)
        self._stream_ctx.__enter__()
        try:
            self.accel_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.accel_graph.capture_end()
            else:
                try:
                    self.accel_graph.capture_end()
                except Exception:  # noqa: BLE001 - the body's error is the one to report
                    pass
                self.accel_graph.reset()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, tb)


def _flat_tensors(values: Any, what: str) -> tuple[list[torch.Tensor], Any]:
    flat, spec = torch.utils._pytree.tree_flatten(values)
    for v in flat:
        if not isinstance(v, torch.Tensor):
            raise TypeError(
                f"make_graphed_callables: {what} must be tensors (or nested tuples/lists/dicts of "
                f"tensors), found {type(v).__name__}"
            )
    return flat, spec


class _Graphed:
    """One callable's forward and backward graphs, and what replays them."""

    def __init__(self, fn: Any, args: tuple[Any, ...], allow_unused: bool) -> None:
        self.fn = fn
        self.args = args  # as the callable takes them (nested structures of tensors too)
        leaves, self.args_spec = _flat_tensors(args, "sample_args")
        self.static_inputs = tuple(leaves)
        self.params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
        self.differentiable = [t for t in self.static_inputs + self.params if t.requires_grad]
        self.allow_unused = allow_unused
        self.fwd = AccelGraph()
        self.bwd = AccelGraph()
        self.outputs: list[torch.Tensor] = []
        self.spec: Any = None
        self.grad_outputs: list[torch.Tensor | None] = []
        self.grad_inputs: list[torch.Tensor | None] = []
        self.returned: tuple[torch.Tensor | None, ...] = ()

    def _backward(self, outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> tuple:
        need = [o for o in outputs if o.requires_grad]
        if not need or not self.differentiable:
            return tuple(None for _ in self.differentiable)
        return torch.autograd.grad(
            need, self.differentiable, grads, allow_unused=self.allow_unused, only_inputs=True
        )

    def warm_up(self, iters: int) -> None:
        for _ in range(iters):
            outputs, _ = _flat_tensors(self.fn(*self.args), "outputs")
            grads = [torch.ones_like(o) for o in outputs if o.requires_grad]
            self._backward(outputs, grads)

    def capture_forward(self, pool: tuple[int, int]) -> None:
        with graph(self.fwd, pool=pool):
            outputs = self.fn(*self.args)
        self.outputs, self.spec = _flat_tensors(outputs, "outputs")
        self.grad_outputs = [torch.empty_like(o) if o.requires_grad else None for o in self.outputs]

    def capture_backward(self, pool: tuple[int, int]) -> None:
        grads = [g for g in self.grad_outputs if g is not None]
        with graph(self.bwd, pool=pool):
            grad_inputs = self._backward(self.outputs, grads)
        by_input = dict(zip(map(id, self.differentiable), grad_inputs, strict=True))
        self.grad_inputs = [by_input.get(id(t)) for t in self.static_inputs + self.params]
        # The captured autograd graph is not needed any more (the backward graph replays it).
        self.outputs = [o.detach() for o in self.outputs]

    def function(self) -> Any:
        graphed = self

        class Replay(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                for static, new in zip(graphed.static_inputs, inputs, strict=False):
                    if static.data_ptr() != new.data_ptr():
                        static.copy_(new)
                graphed.fwd.replay()
                return tuple(o.detach() for o in graphed.outputs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple:
                for static, g in zip(graphed.grad_outputs, grads, strict=True):
                    if static is None:
                        continue
                    if g is None:
                        static.zero_()
                    elif static.data_ptr() != g.data_ptr():
                        static.copy_(g)
                graphed.bwd.replay()
                # Kept referenced, so that autograd does not steal them as .grad: a parameter's
                # .grad would then be the graph's own buffer, and zero_grad(set_to_none=False)
                # followed by the next replay would count its gradient twice.
                graphed.returned = tuple(
                    None if g is None else g.detach() for g in graphed.grad_inputs
                )
                return graphed.returned

        def run(*args: Any) -> Any:
            leaves, spec = torch.utils._pytree.tree_flatten(args)
            if spec != graphed.args_spec:
                raise TypeError(
                    f"graphed callable: expected arguments structured as its sample_args "
                    f"({len(graphed.static_inputs)} tensors: {graphed.args_spec}), got {spec}"
                )
            out = Replay.apply(*leaves, *graphed.params)
            return torch.utils._pytree.tree_unflatten(list(out), graphed.spec)

        return run


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: tuple[int, int] | None = None,
) -> Any:
    """Graphed versions of callables (modules or functions), as torch.cuda's.

    Each callable runs ``num_warmup_iters`` times on ``sample_args`` (a tuple of arguments per
    callable: tensors, or nested tuples, lists and dicts of tensors), then its forward and its
    backward are captured into two graphs, which all the callables' graphs share one memory
    pool (``pool``, or a new one): forwards in order, backwards in reverse order. Calling the
    result copies its arguments into the captured inputs and replays the forward graph; backward
    replays the backward graph. The arguments must have the sample's structure, shapes, dtypes
    and devices, and which of them require grad. A module keeps its own ``forward`` for calls in
    the other training mode than at capture.
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError("make_graphed_callables: one tuple of sample_args per callable")
    parts = []
    for fn, args in zip(callables, sample_args, strict=True):
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        if isinstance(fn, torch.nn.Module) and (fn._backward_hooks or fn._forward_hooks):
            raise RuntimeError(
                "make_graphed_callables: modules with registered hooks cannot be graphed (the "
                "hooks would run once, at capture)"
            )
        parts.append(_Graphed(fn, args, allow_unused_input))
    from torch_accel.accel import synchronize

    synchronize()
    side = Stream()
    side.wait_stream(current_stream())
    with stream_context(side):
        for part in parts:
            part.warm_up(num_warmup_iters)
    current_stream().wait_stream(side)
    pool = pool if pool is not None else graph_pool_handle()
    for part in parts:
        part.capture_forward(pool)
    for part in reversed(parts):
        part.capture_backward(pool)
    results = []
    for fn, part in zip(callables, parts, strict=True):
        run = part.function()
        if isinstance(fn, torch.nn.Module):
            training = fn.training
            original = fn.forward

            def forward(*args: Any, _run: Any = run, _orig: Any = original, _mod: Any = fn,
                        _training: bool = training) -> Any:  # fmt: skip
                return _run(*args) if _mod.training == _training else _orig(*args)

            fn.forward = forward  # type: ignore[method-assign]
            results.append(fn)
        else:
            results.append(run)
    return results[0] if single else tuple(results)
