"""Accel's Inductor scheduling: the C++ backend, with every kernel kept within the device's
limits on arguments and unique buffers (``max_kernel_args``/``max_kernel_buffers`` of
``torch.accel.get_device_properties``; ``ACCEL_MAX_KERNEL_ARGS``/``_BUFFERS`` on the host).

Inductor's own guard (``max_fusion_unique_io_buffers``) only vetoes fusing two nodes, and the
C++ backend then packs unfused nodes into one function anyway (up to 500 arguments). Here the
veto applies per device by default, counting every buffer the fused nodes touch (the user's
``max_fusion_unique_io_buffers``, when set, is used instead, as Inductor uses it), and the
kernel group is flushed before a node would take it past the device's limits; a single node
that alone exceeds them is an error that says so.

Generated loops go parallel only for as much work as an eager accel kernel needs before it uses
intra-op threads (``torch_accel._C._serial_numel``, ATen's grain size). A user's
``cpp.min_chunk_size`` is kept.

Inductor reorders loops to enable fusions on every device type but "cpu", and the C++ backend
reads loop ranges from a field the reordering leaves stale: each node's ranges are made to
follow its reordered body before the C++ backend looks at them (``_follow_loop_order``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch
from torch._inductor import config
from torch._inductor.codegen.common import REMOVED
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.virtualized import V

import torch_accel
from torch_accel._inductor.vec_ops import AccelKernelProxy

# Arguments Inductor may add to a kernel beyond its buffers (size variables of dynamic shapes).
_ARG_HEADROOM = 4


# Inductor's default cpp.min_chunk_size (work items per thread before a loop goes parallel).
_DEFAULT_MIN_CHUNK = int(os.environ.get("TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE", "512"))


def _cpp_codegen() -> contextlib.AbstractContextManager[Any]:
    """Inductor's configuration while it generates an accel kernel.

    - ``cuda_backend = "cpp"``: Inductor asks ``get_current_backend()`` which code generator
      serves the current device, and answers ``config.cuda_backend`` ("triton") for every device
      but cpu, mps and xpu. For accel's C++ kernels the C++ rules must apply (dtype propagation,
      ``masked``, bf16 upcasts); with "triton", the vectorized C++ kernel of an embedding fails
      (``indirect_assert``: a CSE variable without dtype).
    - ``cpp.min_chunk_size``: the parallelism rule above, unless the user set one.
    """
    patch: dict[str, Any] = {"cuda_backend": "cpp"}
    if config.cpp.min_chunk_size == _DEFAULT_MIN_CHUNK and (
        "TORCHINDUCTOR_CPP_MIN_CHUNK_SIZE" not in os.environ
    ):
        from torch._inductor.utils import parallel_num_threads

        serial = torch_accel._C._serial_numel()
        patch["cpp.min_chunk_size"] = max(_DEFAULT_MIN_CHUNK, serial // parallel_num_threads())
    return config.patch(patch)


@functools.cache
def device_limits(index: int) -> tuple[int, int]:
    """(arguments, unique buffers) one kernel may take on accel device ``index``."""
    p = torch.accel.get_device_properties(index)  # type: ignore[attr-defined]
    return p.max_kernel_args, p.max_kernel_buffers


def node_limits(node: Any) -> tuple[int, int]:
    device = node.get_device()
    return device_limits(device.index if device is not None and device.index is not None else 0)


def _node_buffers(node: Any) -> set[str]:
    return {dep.name for dep in node.read_writes.reads_and_writes()}


def group_buffers(group: Any) -> set[str]:
    args = group.args
    names = set(args.input_buffers)
    names |= {k for k, v in args.output_buffers.items() if v is not REMOVED}
    names |= {k for k, v in args.inplace_buffers.items() if v is not REMOVED}
    return names


def check_kernel_limits(buffers: int, args: int, max_buffers: int, max_args: int) -> None:
    """Raises where one generated kernel takes more buffers or arguments than the device's."""
    if buffers > max_buffers or args > max_args:
        raise RuntimeError(
            f"torch_accel: one Inductor kernel needs {buffers} buffers and {args} arguments, "
            f"beyond accel's limits ({max_buffers} buffers, {max_args} arguments: "
            "ACCEL_MAX_KERNEL_BUFFERS / ACCEL_MAX_KERNEL_ARGS, less Inductor's headroom); "
            "lower torch._inductor.config.realize_acc_reads_threshold or "
            "max_pointwise_cat_inputs so that lowering merges fewer inputs into one node"
        )


def too_many_buffers(scheduler: Any, node1: Any, node2: Any) -> bool:
    """Whether fusing ``node1`` and ``node2`` would take one kernel past the device's buffer
    limit (or past the user's ``max_fusion_unique_io_buffers``, counted as Inductor counts)."""
    if config.max_fusion_unique_io_buffers is not None:
        return scheduler.fusion_prevent_too_many_reads_and_writes(
            node1, node2, config.max_fusion_unique_io_buffers
        )
    # Inductor's count credits the buffers fusion makes internal, but the C++ backend keeps
    # some of them as kernel arguments (one written in one loop nest of the fused kernel and
    # read in another): a fusion it allowed at 64 of 64 became a 68-buffer kernel (RWKV's
    # backward). Counting every buffer the fused nodes touch keeps the device's limit.
    return len(_node_buffers(node1) | _node_buffers(node2)) > node_limits(node1)[1]


class AccelCppScheduling(CppScheduling):
    # Accel's vectorized code for the operations it generates faster than Inductor (vec_ops.py).
    kernel_proxy_cls = AccelKernelProxy

    def __new__(cls, scheduler: Any = None) -> Any:
        # Registered before the runtime started (registering starts nothing), on a driver that
        # turned out to need Triton kernels: Triton's scheduling from now on.
        # (scheduler None: Inductor asks for the backend's features, during lowering.)
        if cls is AccelCppScheduling:
            from torch_accel._inductor import kernels, use_triton_kernels

            if kernels() == "triton":
                return use_triton_kernels()(scheduler)
        return super().__new__(cls)

    def __init__(self, scheduler: Any) -> None:
        # Generated C++ kernels run on the host, on accel memory: only where the host can touch
        # it (the host driver; the cuda driver gets Triton kernels: triton_scheduling.py).
        if not torch_accel.driver_capabilities()["host_accessible_memory"]:
            raise RuntimeError(
                f"ACCEL_INDUCTOR_KERNELS=cpp: Inductor's C++ kernels run on the host, and the "
                f"{torch_accel.driver()} driver's device memory is not host memory; use "
                "ACCEL_INDUCTOR_KERNELS=auto (Triton kernels on this driver)"
            )
        super().__init__(scheduler)

    def define_kernel(self, src_code: str, nodes: Any, kernel_args: Any = None) -> str:
        # The wrapper makes this kernel an accel stream kernel (wrapper.py); CPU kernels of the
        # same graph (a CPU optimizer state, say) stay Python bindings.
        wrapper = V.graph.wrapper_code
        wrapper.accel_kernel_definition = True
        try:
            return super().define_kernel(src_code, nodes, kernel_args)
        finally:
            wrapper.accel_kernel_definition = False

    def _follow_loop_order(self, *nodes: Any) -> None:
        """Makes each node's ``group`` (the loop ranges the C++ backend generates) follow its
        loop body again after Inductor's loop reordering.

        ``Scheduler.can_fuse`` reorders a node's loops to match a fusion partner
        (``loop_ordering_after_fusion``, on by default) and skips that only for nodes whose
        device type is "cpu": ``apply_new_loop_order`` permutes the body and ``_sizes`` but
        leaves ``group``, which the C++ backend reads for its loop ranges and fusion checks (the
        Triton backend's group, numel and rnumel, does not change with the order). The kernel
        then ran the loops in the old order around the new body's indexing: out-of-bounds
        reads and writes (Mamba's backward crashed, its compiled gradients were wrong).
        """
        for node in nodes:
            self._follow(node)

    def _follow(self, node: Any) -> bool:
        from torch._inductor.codegen.cpp import OuterLoopFusedSchedulerNode
        from torch._inductor.scheduler import FusedSchedulerNode, SchedulerNode

        if isinstance(node, SchedulerNode):
            if node.is_template():
                return False
            ranges = self.group_fn(node._sizes)
            if ranges == node.group[1]:
                return False
            node.group = (node.group[0], ranges)
            return True
        if isinstance(node, OuterLoopFusedSchedulerNode):
            parts = node.get_outer_nodes()
        else:  # a fused node's nodes, a foreach node's subkernels
            parts = getattr(node, "snodes", ())
        followed = False
        for part in parts:
            followed = self._follow(part) or followed
        if followed and isinstance(node, FusedSchedulerNode) and not node.is_foreach():
            node.group = max(node.snodes, key=lambda n: int(n.is_reduction())).group
        return followed

    def can_fuse_vertical(self, node1: Any, node2: Any) -> bool:
        self._follow_loop_order(node1, node2)
        if too_many_buffers(self.scheduler, node1, node2):
            return False
        return super().can_fuse_vertical(node1, node2)

    def can_fuse_horizontal(self, node1: Any, node2: Any) -> bool:
        self._follow_loop_order(node1, node2)
        if too_many_buffers(self.scheduler, node1, node2):
            return False
        return super().can_fuse_horizontal(node1, node2)

    def fuse(self, node1: Any, node2: Any) -> Any:
        self._follow_loop_order(node1, node2)
        return super().fuse(node1, node2)

    def codegen_template(self, *args: Any, **kwargs: Any) -> Any:
        # Templates (flex_attention's, flex.py) render their inlined modifications again here.
        with _cpp_codegen():
            return super().codegen_template(*args, **kwargs)

    def codegen_node(self, node: Any) -> None:
        self._follow_loop_order(node)
        max_args, max_buffers = node_limits(node)
        max_args -= _ARG_HEADROOM
        group = self.kernel_group
        if group.scheduled_nodes:
            current = group_buffers(group)
            added = _node_buffers(node) - current
            if (
                len(current) + len(added) > max_buffers
                or group.get_num_args() + len(added) > max_args
            ):
                self.flush()
        with _cpp_codegen():
            super().codegen_node(node)
        group = self.kernel_group
        check_kernel_limits(len(group_buffers(group)), group.get_num_args(), max_buffers, max_args)
