"""Inductor's Python wrapper code for accel graphs (and their subgraphs: torch.cond, ...).

Differences from the CPU wrapper: C++ kernels are defined with ``accel_cpp_kernel`` (kernel.py)
and so run on the current accel stream; kernel calls are written as for the CPU (2.11 raises
``device accel nyi`` for any other device); Triton kernels (the cuda driver) are launched on
the current accel stream's handle under their device's guard (and a graph capturing them keeps
their tensors' memory, as for accel's own launches); buffers are allocated on the
graph's accel device with its index (2.11 writes ``device='accel'``, the current device, which
is wrong for inputs on another device).
"""

from __future__ import annotations

from typing import Any

from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.utils import IndentedBuffer
from torch._inductor.virtualized import V

_PYBINDING = "async_compile.cpp_pybinding("


class _AccelWrapperMixin:
    @staticmethod
    def create(
        is_subgraph: bool,
        subgraph_name: str | None,
        parent_wrapper: Any,
        partition_signatures: Any = None,
    ) -> PythonWrapperCodegen:
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return AccelSubgraphWrapper(subgraph_name, parent_wrapper, partition_signatures)
        return AccelWrapper()

    def define_kernel(
        self,
        kernel_name: str,
        kernel_body: str,
        metadata: str | None = None,
        gpu: bool = True,
        cpp_definition: str | None = None,
    ) -> None:
        if getattr(self, "accel_kernel_definition", False) and kernel_body.lstrip().startswith(
            _PYBINDING
        ):
            kernel_body = kernel_body.replace(_PYBINDING, f"accel_cpp_kernel({kernel_name!r}, ", 1)
        super().define_kernel(  # type: ignore[misc]
            kernel_name, kernel_body, metadata=metadata, gpu=gpu, cpp_definition=cpp_definition
        )

    def _generate_kernel_call_helper(
        self, kernel_name: str, call_args: Any, *, device: Any = None, triton: bool = True,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if not triton and device is not None and device.type == "accel":
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))  # type: ignore[attr-defined]
            return
        # A Triton kernel is loaded and launched for the current CUDA device: Inductor guards
        # the devices it knows to be GPUs around their kernels, not accel (its GPU list is
        # fixed), so each accel Triton launch carries its device's guard. Kernel calls are
        # written when the wrapper's lines are generated, into the buffer writeline points at.
        if triton and device is not None and device.type == "accel":
            buffer = getattr(self.writeline, "__self__", None)  # type: ignore[attr-defined]
            if not isinstance(buffer, IndentedBuffer):
                raise RuntimeError("torch_accel: a Triton kernel call outside the wrapper's code")
            self.writeline(f"with {V.graph.device_ops.device_guard(device.index or 0)}:")  # type: ignore[attr-defined]
            with buffer.indent():
                # A graph capturing the launch keeps the memory of its tensors (Triton's
                # launcher takes their pointers, which accel does not see).
                args = ", ".join(map(str, call_args))
                self.writeline(f"accel_capture_keep({device.index or 0}, {args})")  # type: ignore[attr-defined]
                super()._generate_kernel_call_helper(  # type: ignore[misc]
                    kernel_name, call_args, device=device, triton=triton, **kwargs
                )
            return
        super()._generate_kernel_call_helper(  # type: ignore[misc]
            kernel_name, call_args, device=device, triton=triton, **kwargs
        )

    def make_allocation(
        self,
        name: str,
        device: Any,
        dtype: Any,
        shape: Any,
        stride: Any,
        allocation_shape: Any = None,
        is_pinned: bool = False,
    ) -> str:
        line = super().make_allocation(  # type: ignore[misc]
            name, device, dtype, shape, stride, allocation_shape, is_pinned
        )
        if device.type == "accel" and device.index is not None:
            line = line.replace("device='accel'", f"device='accel:{device.index}'")
        return line


class AccelWrapper(_AccelWrapperMixin, PythonWrapperCodegen):
    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torch_accel._inductor.kernel import accel_cpp_kernel")
        self.imports.writeline("from torch_accel._C import _capture_keep as accel_capture_keep")


class AccelSubgraphWrapper(_AccelWrapperMixin, SubgraphPythonWrapperCodegen):
    pass
