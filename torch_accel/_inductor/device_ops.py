"""The code snippets Inductor's wrapper writes for accel devices (``DeviceOpOverrides``).

Registered with ``register_device_op_overrides("accel", ...)``; without it Inductor falls back
to the CPU's snippets, whose device guard does nothing (a graph on ``accel:1`` would allocate
and launch on the current device). Of the C++ wrapper's snippets (``cpp_*``) only the kernel type is
asked for C++ kernels; cpp_wrapper.py launches them itself.
"""

from __future__ import annotations

import torch
from torch._inductor.codegen.common import DeviceOpOverrides


def raw_stream(device_index: int) -> int:
    """The driver's handle of the current accel stream of ``device_index``, for generated code
    that passes streams to kernels (``torch.Stream.native_handle``: the ``cudaStream_t`` on the
    cuda driver, the driver's stream object on the host driver)."""
    return torch.accel.current_stream(device_index).native_handle  # type: ignore[attr-defined]


class AccelDeviceOpOverrides(DeviceOpOverrides):
    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from torch_accel._inductor.device_ops import raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return f"torch.accel.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.accel.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.accel.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        # The C++ wrapper's (AOTInductor's) table of loaded kernels: C++ kernels need none.
        return "void*"
