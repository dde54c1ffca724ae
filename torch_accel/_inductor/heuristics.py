"""Inductor's matrix-product choices on accel: one per operator, so ``max-autotune`` compiles.

With ``mode="max-autotune"`` Inductor lowers each matrix product to every choice it has for the
device and times them. Its benchmarker times every device but the CPU with CUDA events
(``torch/_inductor/runtime/benchmarking.py``), so on accel each timing fails ("Found no NVIDIA
driver", logged) and, with every choice failed, the compile raises ``NoValidChoicesError`` (and
Inductor's autotune cache keeps the failed timings on disk for later processes). An operator
with one choice is taken without timing.

accel has no matrix-product templates (Inductor's Triton ones need a GPU device type, its C++
ones the CPU), so its choices are ATen's extern kernels, one per operator except ``addmm`` with
a broadcast bias (``nn.Linear``'s), where Inductor adds ``bias_addmm`` (the bias expanded, for
cuBLASLt's epilogue) to ``addmm``. The heuristic below, registered for accel through
Inductor's template-heuristic registry (the per-device registration point those choices come
from), offers no ``bias_addmm``: ``addmm`` stays, the choice the default mode makes, and
``max-autotune`` compiles what the default mode does. test_compile_modes.py compiles every
matrix-product lowering under ``max-autotune`` and fails if torch adds a second choice.
"""

from __future__ import annotations

from torch._inductor.kernel.mm import aten_bias_addmm
from torch._inductor.template_heuristics.base import TemplateConfigHeuristics
from torch._inductor.template_heuristics.registry import register_template_heuristic


def apply() -> None:
    # The base heuristic offers no configuration: bias_addmm is no choice on accel.
    register_template_heuristic(aten_bias_addmm.uid, "accel", op_name="addmm")(
        TemplateConfigHeuristics
    )
