"""Accel's Inductor scheduling where device memory is not host memory (the cuda driver):
Inductor's Triton kernels, launched on the accel stream.

Inductor generates Triton kernels for accel tensors as for any GPU device type: the kernels'
metadata names the accel device (``DeviceProperties(type="accel", cc=...)``), so Inductor
reaches the device through accel's interface (interface.py: devices, streams), and Triton
compiles them for the target ``GPUTarget("accel", cc, 32)``, which torch_accel's Triton backend
plugin (``_torch_accel_triton``: CUDA's compilation) serves. Triton's CUDA driver loads and
launches them on the stream the wrapper passes: the ``cudaStream_t`` of the current accel
stream (device_ops.py), so compiled code is ordered with eager accel work as on the host driver.
Extern kernels (matrix products, operators Inductor does not lower) are accel operators.

The device's limits on buffers and arguments per kernel hold as for the C++ kernels
(scheduling.py): no fusion past them, and an error where lowering alone made such a kernel.

On the host driver accel's kernels are C++ (scheduling.py); ``ACCEL_INDUCTOR_KERNELS=triton``
makes them Triton there too, which only Triton's interpreter can run (``TRITON_INTERPRET=1``,
set before Triton is imported): the tests check the Triton path's values that way where no GPU
is present.
"""

from __future__ import annotations

import os
from typing import Any

from torch._inductor import config
from torch._inductor.codegen.triton import TritonScheduling
from torch._inductor.virtualized import V

import torch_accel
from torch_accel._inductor.scheduling import (
    check_kernel_limits,
    device_limits,
    group_buffers,
    node_limits,
    too_many_buffers,
)


def check_can_run() -> None:
    """Raises, saying what to do, where accel's Triton kernels cannot run or compile."""
    if torch_accel.driver_capabilities()["host_accessible_memory"]:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"ACCEL_INDUCTOR_KERNELS=triton: the {torch_accel.driver()} driver has no GPU "
                "to run Triton kernels on, only Triton's interpreter can (TRITON_INTERPRET=1, "
                "set before Triton is imported; slow, for testing); unset "
                "ACCEL_INDUCTOR_KERNELS for accel's C++ kernels"
            )
        return
    kind, why = torch_accel.executor()
    if kind != "cuda":
        raise RuntimeError(
            f"torch.compile on accel: the {torch_accel.driver()} driver's device memory is not "
            "host memory, so Inductor's C++ kernels cannot run on it, and accel's Triton kernels "
            f"run only where accel's operators run through CUDA (the cuda driver; here: {kind}"
            f"{': ' + why if why else ''}): run this model eagerly, or with ACCEL_DRIVER=host"
        )
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            f"torch.compile on accel's {torch_accel.driver()} driver generates Triton kernels, "
            f"and Triton cannot be imported here ({e}; it comes with torch's CUDA wheels)"
        ) from e
    import triton.backends

    if "accel" not in triton.backends.backends:
        raise RuntimeError(
            "Triton did not load torch_accel's compiler for accel kernels (the 'accel' entry "
            "of the triton.backends entry points, module _torch_accel_triton): reinstall "
            "torch_accel, and leave TRITON_BACKENDS_IN_TREE unset (it skips entry points)"
        )


# Inductor's default combo_kernel_max_num_args (a value the user did not choose).
_DEFAULT_COMBO_ARGS = config.get_config_copy()["combo_kernel_max_num_args"]


class AccelTritonScheduling(TritonScheduling):
    def __init__(self, scheduler: Any) -> None:
        if scheduler is not None:  # None: Inductor only asks for the backend's features
            check_can_run()
        super().__init__(scheduler)

    def can_fuse_vertical(self, node1: Any, node2: Any) -> bool:
        if too_many_buffers(self.scheduler, node1, node2):
            return False
        return super().can_fuse_vertical(node1, node2)

    def can_fuse_horizontal(self, node1: Any, node2: Any) -> bool:
        if too_many_buffers(self.scheduler, node1, node2):
            return False
        return super().can_fuse_horizontal(node1, node2)

    def codegen_combo_kernel(self, combo_kernel_node: Any) -> None:
        # Foreach and combo kernels are split by Inductor's combo_kernel_max_num_args (buffers
        # read and written per kernel): the device's limit, unless the user set a value.
        _, max_buffers = node_limits(combo_kernel_node)
        limit = config.combo_kernel_max_num_args
        if limit == _DEFAULT_COMBO_ARGS:
            limit = min(limit, max_buffers)
        with config.patch(combo_kernel_max_num_args=limit):
            super().codegen_combo_kernel(combo_kernel_node)

    def define_kernel(self, src_code: str, node_schedule: Any, kernel: Any) -> str:
        # Fusion respects the buffer limit (above); a node lowering merged alone can still
        # exceed it, which is an error naming the setting to lower, as for C++ kernels.
        device = V.graph.get_current_device_or_throw()
        max_args, max_buffers = device_limits(device.index or 0)
        args = kernel.args.python_argdefs()[1]
        check_kernel_limits(len(group_buffers(kernel)), len(args), max_buffers, max_args)
        return super().define_kernel(src_code, node_schedule, kernel)
