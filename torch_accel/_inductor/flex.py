"""flex_attention under torch.compile on accel: Inductor's C++ template, as for the CPU.

Inductor lowers the flex_attention higher-order operator with its C++ template
(``CppFlexAttentionTemplate``, through ``lower_cpu``) when the query is on the CPU and with its
Triton templates on every other device (torch/_inductor/kernel/flex/flex_attention.py chooses on
``device.type == "cpu"``), which the host driver cannot run. accel's generated kernels are C++
(scheduling.py), so accel inputs take the CPU's lowering: one fused, block-sparse kernel with
score_mod and mask_mod inlined, defined and launched as an accel stream kernel like every other
(wrapper.py), so it is ordered with eager accel work.

As on the CPU, the template serves inference: no logsumexp or max-score output, hence no
backward. ``torch_accel/_torch_fixes.py`` lets Dynamo trace flex_attention on accel only where
the template applies and otherwise breaks the graph there (the call runs eagerly, backward
included), naming why.

Registered with Inductor's ``register_lowering`` for the operator: accel queries go to
``lower_cpu``, every other device to the lowering Inductor registered. test_torch_fixes.py fails
once Inductor lowers accel's flex_attention itself (then drop this module).
"""

from __future__ import annotations

from typing import Any


def apply() -> None:
    import torch._inductor.kernel.flex.flex_attention  # noqa: F401  (registers Inductor's)
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu
    from torch._inductor.lowering import lowerings, register_lowering

    from torch_accel._inductor.scheduling import _cpp_codegen

    hop = torch.ops.higher_order.flex_attention
    inductor_lowering = lowerings[hop]
    if getattr(inductor_lowering, "accel", False):
        return

    from torch_accel._inductor import kernels

    def flex_attention(query: Any, *args: Any, **kwargs: Any) -> Any:
        device = query.get_device()
        if device is not None and device.type == "accel" and kernels() == "cpp":
            # The template renders its score_mod and mask_mod while it is lowered: with the
            # C++ backend's rules, as accel's kernels are generated (scheduling.py).
            with _cpp_codegen():
                return lower_cpu(query, *args, **kwargs)
        return inductor_lowering(query, *args, **kwargs)

    flex_attention.inductor_lowering = inductor_lowering  # type: ignore[attr-defined]
    register_lowering(hop, type_promotion_kind=None)(flex_attention)
    lowerings[hop].accel = True  # type: ignore[attr-defined]
