"""torch.compile for accel: Inductor's C++ code generation, kernels launched on accel streams.

Registered the first time Inductor looks for accel's code generators (through the
``torch.accel.Scheduling`` attribute, which Inductor reads for the PrivateUse1 device before any
accel compile), so that importing torch_accel stays cheap:

- ``register_backend_for_device("accel", AccelCppScheduling, AccelWrapper, ...,
  device_custom_pass=AccelPostGradPass())``: the C++ backend within the device's kernel limits,
  accel's wrapper code (kernels on streams, device indices, subgraphs), a C++ wrapper that
  refuses with a message saying so (``cpp_wrapper``, AOTInductor), and the pass whose identity
  keys the caches;
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

import threading

import torch

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
        from torch._inductor.codegen.common import (
            register_backend_for_device,
            register_device_op_overrides,
        )

        from torch_accel._inductor import decompositions, flex, heuristics
        from torch_accel._inductor.device_ops import AccelDeviceOpOverrides
        from torch_accel._inductor.interface import AccelInterface
        from torch_accel._inductor.passes import AccelPostGradPass
        from torch_accel._inductor.scheduling import AccelCppScheduling
        from torch_accel._inductor.wrapper import AccelCppWrapperRefusal, AccelWrapper

        register_backend_for_device(
            "accel",
            AccelCppScheduling,
            AccelWrapper,
            AccelCppWrapperRefusal,
            device_custom_pass=AccelPostGradPass(),
        )
        register_device_op_overrides("accel", AccelDeviceOpOverrides())
        decompositions.apply()
        heuristics.apply()
        flex.apply()
        register_interface_for_device("accel", AccelInterface)
        for i in range(torch.accel.device_count()):  # type: ignore[attr-defined]
            register_interface_for_device(f"accel:{i}", AccelInterface)
        _registered = True


def scheduling() -> type:
    """``torch.accel.Scheduling``: registers everything, returns accel's scheduling class."""
    register()
    from torch_accel._inductor.scheduling import AccelCppScheduling

    return AccelCppScheduling
