"""torch.compile for accel: Inductor's C++ code generation, kernels launched on accel streams.

Registered the first time Inductor looks for accel's code generators (through the
``torch.accel.Scheduling`` attribute, which Inductor reads for the PrivateUse1 device before any
accel compile), so that importing torch_accel stays cheap:

- ``register_backend_for_device("accel", <scheduling>, AccelWrapper, ...,
  device_custom_pass=AccelPostGradPass())``: the C++ backend within the device's kernel limits
  where the host can touch device memory (the host driver), Inductor's Triton backend elsewhere
  (the cuda driver; ``ACCEL_INDUCTOR_KERNELS`` chooses otherwise: ``kernels()``),
  accel's wrapper code (kernels on streams, device indices, subgraphs), its C++ wrapper
  (``cpp_wrapper``, AOTInductor: cpp_wrapper.py), and the pass whose identity keys the caches;
- ``register_interface_for_device`` for ``accel`` and ``accel:N`` (reductions and streams need
  it);
- ``register_device_op_overrides("accel", ...)``: the wrapper's device guard, set_device,
  synchronize and raw-stream snippets (device_ops.py);
- the operators accel keeps whole (decompositions.py: ``native_layer_norm``);
- one choice per matrix product, so that ``max-autotune`` compiles (Inductor cannot time
  accel kernels), and no combo kernels of accel's C++ nodes (heuristics.py);
- flex_attention lowered with Inductor's C++ template, as for the CPU (flex.py).

Everything goes through PyTorch's registration functions; nothing of torch is patched.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_registered = False

# The module after whose import accel registers (torch_accel/_import_hook.py says why then).
INDUCTOR_TRIGGER = "torch._inductor.compile_fx"


def register_after_inductor_import() -> None:
    """Registers now if Inductor's compiler is already imported, else right after its import."""
    from torch_accel._import_hook import after_import

    after_import(INDUCTOR_TRIGGER, register)


def register() -> None:
    """Registers accel with Inductor and Dynamo (idempotent, thread-safe)."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch._dynamo.device_interface import register_interface_for_device
        from torch._inductor.codegen.common import register_device_op_overrides

        from torch_accel._inductor import decompositions, flex, heuristics
        from torch_accel._inductor.device_ops import AccelDeviceOpOverrides
        from torch_accel._inductor.interface import AccelInterface

        _register_backend(scheduling_class(start=False))
        register_device_op_overrides("accel", AccelDeviceOpOverrides())
        decompositions.apply()
        heuristics.apply()
        flex.apply()
        register_interface_for_device("accel", AccelInterface)
        # Every possible index, not device_count(): counting loads the driver libraries (and on
        # cuda asks NVML or CUDA), which importing Inductor should not cost.
        for i in range(_MAX_DEVICES):
            register_interface_for_device(f"accel:{i}", AccelInterface)
        _registered = True


def _register_backend(scheduling: type) -> None:
    from torch._inductor.codegen.common import register_backend_for_device

    from torch_accel._inductor.cpp_wrapper import AccelCppWrapper
    from torch_accel._inductor.passes import AccelPostGradPass
    from torch_accel._inductor.wrapper import AccelWrapper

    register_backend_for_device(
        "accel",
        scheduling,
        AccelWrapper,
        AccelCppWrapper,
        device_custom_pass=AccelPostGradPass(),
    )


def use_triton_kernels() -> type:
    """Registers Inductor's Triton scheduling for accel in place of the C++ one, and returns it:
    for a runtime that started, on a driver needing Triton kernels, after accel registered
    (registering does not start the runtime, so it could not tell then)."""
    from torch._inductor.codegen import common

    from torch_accel._inductor.triton_scheduling import AccelTritonScheduling

    with _lock:
        _register_backend(AccelTritonScheduling)
        # What lowering asks of the backend was answered for the C++ one.
        cached = getattr(common.get_backend_features, "cache_clear", None)
        if cached is not None:
            cached()
    return AccelTritonScheduling


def scheduling() -> type:
    """``torch.accel.Scheduling``: registers everything, returns accel's scheduling class."""
    register()
    return scheduling_class(start=False)  # what register() registered; starts nothing


_KERNELS = ("auto", "cpp", "triton")
# Device strings ("accel:N") Dynamo may look up: as many as the host driver allows (64).
_MAX_DEVICES = 64


def kernels(*, start: bool = True) -> str:
    """The language of accel's generated kernels: ``"cpp"`` (Inductor's C++ backend, kernels
    run on the host) or ``"triton"``. ``ACCEL_INDUCTOR_KERNELS`` chooses; ``auto`` (the default)
    takes C++ where the driver's device memory is host memory (the host driver) and Triton
    elsewhere (the cuda driver). Asking the driver starts the runtime: with ``start=False``,
    ``auto`` answers ``"cpp"`` until the runtime has started (AccelCppScheduling hands over to
    Triton's when it finds otherwise), and a driver that cannot start answers ``"cpp"`` (compiling
    for accel then raises its error)."""
    from torch_accel import _C

    value = os.environ.get("ACCEL_INDUCTOR_KERNELS", "auto").strip().lower() or "auto"
    if value not in _KERNELS:
        raise ValueError(f"ACCEL_INDUCTOR_KERNELS={value!r}: use one of {', '.join(_KERNELS)}")
    if value != "auto":
        return value
    if not start and not _C.is_initialized():
        return "cpp"
    try:
        capabilities = _C.driver_capabilities()
    except _C.AccelError:
        return "cpp"
    return "cpp" if capabilities["host_accessible_memory"] else "triton"


def scheduling_class(*, start: bool = True) -> type:
    """Accel's Inductor scheduling: C++ kernels (scheduling.py) or Triton kernels
    (triton_scheduling.py), as ``kernels()`` says."""
    if kernels(start=start) == "triton":
        from torch_accel._inductor.triton_scheduling import AccelTritonScheduling

        return AccelTritonScheduling
    from torch_accel._inductor.scheduling import AccelCppScheduling

    return AccelCppScheduling
