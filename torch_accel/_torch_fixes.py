"""The one place where torch_accel replaces a piece of PyTorch: a defect of torch 2.11 that no
registration or hook can reach. Each fix names the upstream change that removes it, and
test/test_torch_fixes.py fails once the installed torch no longer needs it.

``Tensor.__dlpack_device__`` (torch/_tensor.py) tells PrivateUse1 tensors by the literal device
type ``"privateuse1"``, which a renamed backend's tensors never have (theirs is ``"accel"``), so
``torch.from_dlpack(t)`` and every DLPack consumer that asks an accel tensor for its device raise
``ValueError: Unknown device type accel for Dlpack``. The C++ side already converts accel tensors
(``kDLExtDev`` and the device index, both ways: ``torch.utils.dlpack.to_dlpack``). The method is
wrapped: accel tensors answer ``(kDLExtDev, index)``, all others go to torch's own method.
Removed by pytorch/pytorch#195815 ("Fix Tensor.__dlpack_device__ never matching renamed
PrivateUse1 backends", open).

``flex_attention`` (torch/nn/attention/flex_attention.py) checks its inputs against a fixed set
of device types (``_validate_device``: cuda, cpu, xpu, hpu) and raises ``ValueError: FlexAttention
is only supported on CUDA, CPU or HPU devices`` for accel, although its eager path (the
flex_attention higher-order operator's math, forward and backward) is made of operators accel
runs. Models that pick it (transformers' ``attn_implementation="flex_attention"``, diffusers'
LTX-2 decoder) stop there. The check is wrapped: accel inputs pass as CUDA's do (backward
included), all others go to torch's own check. Under torch.compile with accel's C++ kernels
(the host driver), Inductor lowers accel's flex_attention with its C++ template
(torch_accel/_inductor/flex.py), which serves inference only (with Triton kernels, the cuda
driver, Inductor's Triton templates serve training too, and nothing below applies); the kernel
options (``_apply_kernel_options``, where flex_attention decides whether the
kernel must return logsumexp: with gradients enabled or ``return_lse``) are wrapped too, so that
on accel Dynamo traces flex_attention only where that template applies and otherwise breaks the
graph there, saying why (the call then runs eagerly, backward included). PrivateUse1 was asked
for in the review of pytorch/pytorch#148656 (which added hpu to the set); no upstream change
makes the set extensible yet. The same wrapper keeps one configuration off the template: where
Inductor's vectors hold 8 floats (AVX2 without AVX-512), its micro-GEMM for the transposed key
(``CppMicroGemmFP32Vec`` with ``trans_b``, torch/_inductor/codegen/cpp_micro_gemm.py, from
pytorch/pytorch#147068) computes a full 16-column block for an 8-column tail when the head dim
is 8 or 16: it reads 8 key rows past the tile (past the key tensor at its end) and writes their
scores past the row, over the running maxima of the first rows. Results then depend on that
memory: with a key/value length of 8 mod 16 the CPU's own compiled flex_attention gives wrong
values or NaN (a Llama with 16-dim heads and 40 tokens); accel's came out right in the runs
measured, by what its allocator placed after the key. No upstream issue or fix was found (none
could be filed from here); on accel such a call runs eagerly instead.

``run_and_save_rng_state`` and ``run_with_rng_state`` (torch/_prims/rng_prims.py), the
higher-order operators that AOTAutograd's partitioner wraps around random operators it recomputes
in the backward (activation checkpointing with dropout inside a compiled region), pick the
generator to save and restore from a fixed set of device types (cpu, cuda, hpu, xpu) and raise
``AssertionError: Backend not supported for None`` for accel: ``torch.compile`` with the
``aot_eager`` backend (and any AOTAutograd backend but Inductor, which lowers them itself) fails
on accel tensors. Their BackendSelect and fake-tensor kernels are wrapped: accel arguments save
and restore accel's generator (``torch.accel.get_rng_state``/``set_rng_state``), all others go to
torch's own kernels. Removed by pytorch/pytorch#193113 ("Support PrivateUse1 backend in
rng_prims RNG state HOPs", open; issue pytorch/pytorch#193112).

``torch.nn.parallel.comm``'s ``broadcast``, ``broadcast_coalesced``, ``scatter`` and ``gather``
(what ``nn.DataParallel`` copies its inputs, replicas and outputs with) call C++ functions built
for CUDA devices alone (torch/csrc/cuda/comm.cpp): on accel tensors they raise "Found no NVIDIA
driver on your system", so ``nn.DataParallel(model)`` over accel fails at its first forward, even
with one device, although the rest of DataParallel (device choice, replication, parallel_apply's
threads and streams, reduce_add) is device-generic. The four functions are wrapped: accel tensors
(or CPU tensors sent to accel devices, or to device indices where accel is the accelerator) go
to ``torch.accel.comm``, which gives torch.cuda.comm's results on accel; everything else goes to
torch's own. Removed by pytorch/pytorch#143239 ("torch.nn.DataParallel fails on multi-XPU
environment", open: the same functions for XPU; its draft fix, pytorch/pytorch#143335, was
closed unmerged).

``torch.is_autocast_enabled()`` without a device type answers for CUDA alone in torch 2.11, and
PyTorch's own modules ask it that way: ``nn.MultiheadAttention`` and ``nn.TransformerEncoder``
(Layer) leave their fused fast path under autocast by it, and ``nn.DataParallel``'s
parallel_apply carries the caller's autocast into its threads by it. Under
``torch.autocast("accel")`` the fast path ran anyway (its fused kernel sees no autocast: an
encoder fed bfloat16 activations raised "expected m1 and m2 to have the same dtype", fed float32
it computed in float32), and DataParallel's replicas ran without autocast. The function is
wrapped: without arguments it is true when autocast is on for CUDA (torch's answer) or for
accel; with a device type it is torch's own. Removed by pytorch/pytorch#191916 ("Make
torch.is_autocast_enabled & torch.set_autocast_enabled support on current accelerator", merged
after 2.11; issue pytorch/pytorch#191796).

DTensor's public ``register_sharding`` (torch.distributed.tensor.experimental) derives which
arguments key its sharding cache from the schema alone, and leaves keyword-only tensors out:
the sharding rules accel gives ATen's CPU flash attention (distributed/tensor_sharding.py),
whose ``attn_mask`` is keyword-only, would reuse a decision made for one mask (or none) for calls
with another, and hand the kernel a mask it was not sharded for. The registration's cache key
info is amended to include ``attn_mask`` (``dtensor_cache_key_includes``). Removed by
pytorch/pytorch#171248 ("register_sharding supports custom static argnum and kwargkey": a
``schema_info`` argument; issue pytorch/pytorch#167977).
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
from typing import Any

import torch

_original_dlpack_device = torch.Tensor.__dlpack_device__


@functools.wraps(_original_dlpack_device)
def _dlpack_device(self: torch.Tensor) -> tuple[enum.IntEnum, int]:
    if not torch.overrides.has_torch_function_unary(self) and self.device.type == "accel":
        from torch.utils.dlpack import DLDeviceType

        return (DLDeviceType.kDLExtDev, self.device.index or 0)
    return _original_dlpack_device(self)


_flex = importlib.import_module("torch.nn.attention.flex_attention")
_original_validate_device = _flex._validate_device


@functools.wraps(_original_validate_device)
def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if query.device.type == "accel":
        return  # query, key and value are on one device: checked before
    _original_validate_device(query, key, value)


_original_apply_kernel_options = _flex._apply_kernel_options
# Inductor's C++ flex template needs AVX2 (torch/_inductor/kernel/flex/flex_cpu.py), read here
# once: Dynamo traces the check below and cannot call into torch.cpu's helpers.
_CPP_FLEX = torch.cpu._is_avx2_supported() and os.environ.get("ATEN_CPU_CAPABILITY") != "default"
# Whether its vectors hold 8 floats (Inductor picks AVX-512 where the CPU has it, unless
# ATEN_CPU_CAPABILITY says avx2): the transposed micro-GEMM's tail defect (above) applies there.
_CPP_FLEX_VEC8 = _CPP_FLEX and (
    not torch.cpu._is_avx512_supported() or os.environ.get("ATEN_CPU_CAPABILITY") == "avx2"
)
_CPP_FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _cpp_kernels() -> bool:
    """Whether accel's compiled kernels are C++ (the template's limits apply). Dynamo calls it
    while tracing (accel tensors exist), as a constant (marked once Dynamo is imported: marking
    it here would import Dynamo with torch_accel, 2 s of every ``import torch``)."""
    from torch_accel._inductor import kernels

    try:
        return kernels() == "cpp"
    except ValueError:  # a bad ACCEL_INDUCTOR_KERNELS: torch.compile raises it, naming it
        return True


@functools.wraps(_original_apply_kernel_options)
def _apply_kernel_options(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any
) -> dict[str, Any]:
    options = _original_apply_kernel_options(query, key, value, *args, **kwargs)
    if query.device.type == "accel" and torch.compiler.is_compiling() and _cpp_kernels():
        why = _why_not_compiled(query, key, value, options)
        if why:
            raise NotImplementedError(
                f"flex_attention under torch.compile on accel runs Inductor's C++ template, "
                f"which serves inference only; this call {why}, so it runs eagerly (a graph "
                "break; its backward works). Under torch.no_grad() or torch.inference_mode(), "
                "without return_lse/return_aux, it compiles"
            )
        why = _template_defect(query, key)
        if why:
            raise NotImplementedError(
                f"flex_attention under torch.compile on accel runs Inductor's C++ template; this "
                f"call {why}, so it runs eagerly (a graph break; values as without compile)"
            )
    return options


def _template_defect(query: torch.Tensor, key: torch.Tensor) -> str:
    """Why the C++ template would compute this call wrongly (see the module's text), or ''."""
    head_dim, kv_len = query.size(-1), key.size(-2)
    if _CPP_FLEX_VEC8 and head_dim in (8, 16) and kv_len % 16 == 8:
        return (
            f"has a head dim of {head_dim} and {kv_len} keys: on a CPU with AVX2 but not "
            "AVX-512 the template's key-transposed micro-GEMM writes a 16-column block for the "
            "8 keys of the last 16-key tile, reading memory past the key (wrong values or NaN "
            "on the CPU; pytorch/pytorch#147068's kernel, no fix upstream yet)"
        )
    return ""


def _why_not_compiled(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, options: dict[str, Any]
) -> str:
    if options.get("OUTPUT_LOGSUMEXP") or options.get("OUTPUT_MAX"):
        return "needs the logsumexp (gradients are enabled, or return_lse/return_aux asks)"
    if not (query.dtype == key.dtype == value.dtype and query.dtype in _CPP_FLEX_DTYPES):
        return f"has dtypes {query.dtype}, {key.dtype}, {value.dtype}"
    if query is key or key is value or query is value:
        return "passes one tensor twice among query, key and value"
    if not _CPP_FLEX:
        return "runs on a CPU without AVX2"
    return ""


def _accel_device(args: tuple[object, ...], kwargs: dict[str, object]) -> torch.device | None:
    """The accel device an rng_prims call runs on (its device= or its first tensor's), if any."""
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)  # type: ignore[arg-type]
        return device if device.type == "accel" else None
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device if a.device.type == "accel" else None
    return None


def _run_and_save_rng_state(
    device: torch.device, op: object, /, *args: object, **kwargs: object
) -> tuple[object, object]:
    return torch.accel.get_rng_state(device), op(*args, **kwargs)  # type: ignore[operator]


def _run_with_rng_state(
    device: torch.device, state: torch.Tensor, op: object, /, *args: object, **kwargs: object
) -> object:
    current = torch.accel.get_rng_state(device)
    torch.accel.set_rng_state(state.cpu(), device)
    try:
        return op(*args, **kwargs)  # type: ignore[operator]
    finally:
        torch.accel.set_rng_state(current, device)


def _run_with_fake_rng_state(
    device: torch.device, state: object, op: object, /, *args: object, **kwargs: object
) -> object:
    # Fake tensors carry no generator state to restore (torch's fake kernels skip it too).
    return op(*args, **kwargs)  # type: ignore[operator]


def _wrap_rng_kernels(hop: object, accel_impl: object, fake_impl: object, leading: int) -> None:
    """Routes the BackendSelect and fake-tensor kernels of one rng_prims operator to
    `accel_impl` and `fake_impl` (called with the accel device first, positionally: the
    operator's own device= stays in its kwargs) for accel arguments
    (`leading`: the arguments before the operator's own, the state of run_with_rng_state)."""
    from torch._C import DispatchKey
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernels = hop.py_kernels  # type: ignore[attr-defined]
    modes = hop.python_key_table  # type: ignore[attr-defined]
    backend_select = kernels[DispatchKey.BackendSelect]
    if getattr(backend_select, "_accel_fix", False):
        return
    fake = modes[FakeTensorMode]

    def on_backend_select(*args: object, **kwargs: object) -> object:
        device = _accel_device(args[leading + 1 :], kwargs)
        if device is not None:
            return accel_impl(device, *args, **kwargs)  # type: ignore[operator]
        return backend_select(*args, **kwargs)

    def on_fake(mode: FakeTensorMode, *args: object, **kwargs: object) -> object:
        device = _accel_device(args[leading + 1 :], kwargs)
        if device is not None:
            with mode:
                return fake_impl(device, *args, **kwargs)  # type: ignore[operator]
        return fake(mode, *args, **kwargs)

    on_backend_select._accel_fix = True  # type: ignore[attr-defined]
    on_backend_select.torch_kernel = backend_select  # type: ignore[attr-defined]
    kernels[DispatchKey.BackendSelect] = on_backend_select
    modes[FakeTensorMode] = on_fake
    hop._dispatch_cache.clear()  # type: ignore[attr-defined]


_comm = importlib.import_module("torch.nn.parallel.comm")
_COMM_NAMES = ("broadcast", "broadcast_coalesced", "scatter", "gather")
_original_comm: dict[str, Any] = {name: getattr(_comm, name) for name in _COMM_NAMES}


def _names_accel(devices: list[Any] | None) -> bool:
    """Whether ``devices`` (indices, strings or torch.device) are accel devices: plain indices
    are the accelerator's, as DataParallel passes them."""
    for d in devices or ():
        if isinstance(d, (str, torch.device)):
            return torch.device(d).type == "accel"
    return bool(devices) and torch._utils._get_available_device_type() == "accel"


def _on_accel(tensors: Any, devices: list[Any] | None = None) -> bool:
    listed = [t for t in tensors if isinstance(t, torch.Tensor)]
    if any(t.device.type == "accel" for t in listed):
        return True
    return bool(listed) and all(t.device.type == "cpu" for t in listed) and _names_accel(devices)


def _as_list(devices: Any) -> list[Any] | None:
    return None if devices is None else list(devices)


def _comm_broadcast(tensor: torch.Tensor, devices: Any = None, *, out: Any = None) -> Any:
    devices = _as_list(devices)
    if _on_accel([tensor, *(out or ())], devices):
        return torch.accel.comm.broadcast(tensor, devices, out=out)  # type: ignore[attr-defined]
    return _original_comm["broadcast"](tensor, devices, out=out)


def _comm_broadcast_coalesced(tensors: Any, devices: Any, buffer_size: int = 10485760) -> Any:
    tensors, devices = list(tensors), list(devices)
    if _on_accel(tensors):
        return torch.accel.comm.broadcast_coalesced(tensors, devices, buffer_size)  # type: ignore[attr-defined]
    return _original_comm["broadcast_coalesced"](tensors, devices, buffer_size)


def _comm_scatter(
    tensor: torch.Tensor,
    devices: Any = None,
    chunk_sizes: Any = None,
    dim: int = 0,
    streams: Any = None,
    *,
    out: Any = None,
) -> Any:
    devices = _as_list(devices)
    if _on_accel([tensor, *(out or ())], devices):
        scatter = torch.accel.comm.scatter  # type: ignore[attr-defined]
        return scatter(tensor, devices, chunk_sizes, dim, streams, out=out)
    return _original_comm["scatter"](tensor, devices, chunk_sizes, dim, streams, out=out)


def _comm_gather(tensors: Any, dim: int = 0, destination: Any = None, *, out: Any = None) -> Any:
    tensors = list(tensors)
    if _on_accel([*tensors, out]):
        return torch.accel.comm.gather(tensors, dim, destination, out=out)  # type: ignore[attr-defined]
    return _original_comm["gather"](tensors, dim, destination, out=out)


_comm_fixes = {
    "broadcast": _comm_broadcast,
    "broadcast_coalesced": _comm_broadcast_coalesced,
    "scatter": _comm_scatter,
    "gather": _comm_gather,
}
for _name, _fix in _comm_fixes.items():
    functools.update_wrapper(_fix, _original_comm[_name])


_original_is_autocast_enabled = torch.is_autocast_enabled


def _autocast_answer(device_type: str | None = None) -> bool:
    if device_type is not None:
        return _original_is_autocast_enabled(device_type)
    return _original_is_autocast_enabled("cuda") or _original_is_autocast_enabled("accel")


def _is_autocast_enabled(device_type: str | None = None) -> bool:
    if torch.jit.is_scripting():
        # TorchScript has torch's no-argument form only (CUDA's answer).
        return _original_is_autocast_enabled()
    return _autocast_answer(device_type)


_is_autocast_enabled.__doc__ = _original_is_autocast_enabled.__doc__


def _register_with_dynamo() -> None:
    """Dynamo folds the wrapper into a constant while tracing, as it folds torch's function
    (its guards on the autocast state recompile when that changes): inlined, the wrapper's own
    calls of torch's function would break the graph once Dynamo's list of foldable functions
    holds the wrapper instead (it is built when Dynamo is imported, after the fix)."""
    from torch._dynamo.decorators import substitute_in_graph

    # The polyfill is traced only for an argument Dynamo cannot fold (not a constant).
    substitute_in_graph(
        _is_autocast_enabled, can_constant_fold_through=True, skip_signature_check=True
    )(_autocast_answer)


def dtensor_cache_key_includes(op: Any, kwargs: list[str]) -> None:
    """Makes DTensor's sharding cache tell calls of ``op`` apart by its keyword arguments
    ``kwargs`` too, after ``register_sharding(op)`` registered a rule for it."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    derived = propagator.op_to_schema_info[op]
    propagator.op_to_schema_info[op] = RuntimeSchemaInfo(
        derived.static_argnum,
        sorted({*(derived.static_kwargkey or []), *kwargs}),
        needs_pytree=derived.needs_pytree,
    )


def install() -> None:
    """Applies the fixes (idempotent). Tensors of other devices see torch's own methods."""
    torch.Tensor.__dlpack_device__ = _dlpack_device  # type: ignore[method-assign]
    _flex._validate_device = _validate_device
    _flex._apply_kernel_options = _apply_kernel_options
    rng_prims = importlib.import_module("torch._prims.rng_prims")
    _wrap_rng_kernels(
        rng_prims.run_and_save_rng_state,
        _run_and_save_rng_state,
        _run_and_save_rng_state,  # the state: a real tensor, as the CPU's and CUDA's are
        leading=0,
    )
    _wrap_rng_kernels(
        rng_prims.run_with_rng_state,
        _run_with_rng_state,
        _run_with_fake_rng_state,
        leading=1,
    )
    for name, fix in _comm_fixes.items():
        setattr(_comm, name, fix)
    from torch_accel._import_hook import after_import

    after_import("torch._dynamo", lambda: torch.compiler.assume_constant_result(_cpp_kernels))
    if torch.is_autocast_enabled is not _is_autocast_enabled:
        torch.is_autocast_enabled = _is_autocast_enabled  # type: ignore[assignment]
        after_import("torch._dynamo", _register_with_dynamo)
