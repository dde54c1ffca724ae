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
included), all others go to torch's own check. PrivateUse1 was asked for in the review of
pytorch/pytorch#148656 (which added hpu to the set); no upstream change makes the set
extensible yet.

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
"""

from __future__ import annotations

import enum
import functools
import importlib

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
        if torch.compiler.is_compiling():
            # Inductor would lower it with its GPU template (Triton), which the host driver
            # cannot run; the CPU's C++ template is not wired to accel yet.
            raise NotImplementedError(
                "flex_attention under torch.compile is not supported on accel yet; "
                "call it without torch.compile (eager runs it, forward and backward)"
            )
        return  # query, key and value are on one device: checked before
    _original_validate_device(query, key, value)


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


def install() -> None:
    """Applies the fixes (idempotent). Tensors of other devices see torch's own methods."""
    torch.Tensor.__dlpack_device__ = _dlpack_device  # type: ignore[method-assign]
    _flex._validate_device = _validate_device
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
