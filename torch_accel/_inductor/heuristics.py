"""Two choices Inductor makes for every device, made for accel through its registration points.

Matrix products: one choice each, so that ``mode="max-autotune"`` compiles. With max-autotune
Inductor lowers each matrix product to every choice it has for the device and times them. Its
benchmarker times every device but the CPU with CUDA events
(``torch/_inductor/runtime/benchmarking.py``), so on accel each timing fails ("Found no NVIDIA
driver", logged) and, with every choice failed, the compile raises ``NoValidChoicesError`` (and
Inductor's autotune cache keeps the failed timings on disk for later processes). An operator
with one choice is taken without timing. accel has no matrix-product templates (Inductor's
Triton ones need a GPU device type, its C++ ones the CPU), so its choices are ATen's extern
kernels, one per operator except ``addmm`` with a broadcast bias (``nn.Linear``'s), where
Inductor adds ``bias_addmm`` (the bias expanded, for cuBLASLt's epilogue) to ``addmm``. accel's
entry in Inductor's template-heuristic registry (the per-device registration point those
choices come from) offers no ``bias_addmm``: ``addmm`` stays, the choice the default mode makes.
test_compile_modes.py compiles every matrix-product lowering under max-autotune and fails if
torch adds a second choice.

Combo kernels: ``combo_kernels=True`` groups independent nodes into one kernel for Triton
backends; Inductor's grouping leaves out the CPU's (and MPS's) nodes only, and combining accel's
C++ nodes failed an assertion (``type(self)=<class 'torch._inductor.scheduler.Scheduler'>``:
combo kernels need a SIMD scheduling). The grouping Inductor uses
(``ForeachKernelSchedulerNode.set_group_algorithm_for_combo_kernels``, one per process) is
wrapped to leave accel's nodes out where its kernels are C++ (the C++ backend packs them into
one function anyway, within the device's limits: scheduling.py); where they are Triton (the cuda
driver) accel's nodes combine as CUDA's do, each combo kernel within the device's argument limit
(triton_scheduling.py). A grouping set after accel registered replaces this one.
"""

from __future__ import annotations

from typing import Any

from torch._inductor.kernel.mm import aten_bias_addmm
from torch._inductor.scheduler import ForeachKernelSchedulerNode
from torch._inductor.template_heuristics.base import TemplateConfigHeuristics
from torch._inductor.template_heuristics.registry import register_template_heuristic


def _on_accel(node: Any) -> bool:
    device = node.get_device()
    return device is not None and device.type == "accel"


def apply() -> None:
    # The base heuristic offers no configuration: bias_addmm is no choice on accel.
    register_template_heuristic(aten_bias_addmm.uid, "accel", op_name="addmm")(
        TemplateConfigHeuristics
    )

    group = ForeachKernelSchedulerNode.group_algorithm_for_combo_kernels

    def without_accel(scheduler: Any) -> list[list[Any]]:
        from torch_accel._inductor import kernels

        groups = group(scheduler)
        has_accel = any(_on_accel(n) for nodes in groups for n in nodes)
        if not has_accel or kernels(start=False) == "triton":
            return groups
        return [[n for n in nodes if not _on_accel(n)] for nodes in groups]

    ForeachKernelSchedulerNode.set_group_algorithm_for_combo_kernels(without_accel)
