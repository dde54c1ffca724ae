"""DTensor sharding rules for the attention kernel that scaled_dot_product_attention takes on accel.

On the host driver SDPA's fused path is ATen's CPU flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), for which DTensor has
no sharding strategy in torch 2.11: tensor parallelism over attention heads (``ColwiseParallel``
on the q/k/v projections, pytorch/examples' ``fsdp_tp_example.py``) raised "does not have a
sharding strategy registered" on accel, where CUDA's flash and efficient kernels have strategies.
These rules are CUDA's for its flash kernel: everything replicated, or q, k, v, the output and
the log-sum-exp sharded alike over the batch or the heads dimension; an attention mask (which
CUDA's flash kernel does not take) must be replicated and sharding is offered only over the
dimensions it broadcasts along. Sequence sharding needs ring attention (context parallelism) and
is not offered.

Registered through DTensor's public ``register_sharding`` once ``torch.distributed.tensor`` is
imported (torch_accel does not import it itself), its sharding cache keyed by the mask too
(torch_accel/_torch_fixes.py: torch 2.11's ``register_sharding`` leaves keyword-only tensors out
of the key). The operator is ATen's, shared with the CPU, so DTensors of CPU tensors get the
rules too.
"""

from __future__ import annotations

from typing import Any

import torch


def _strategies(tensors: int, outputs: int, attn_mask: Any) -> list[tuple[list, list]]:
    """Each acceptable sharding: (output placements, input placements) for `tensors` tensor
    arguments laid out alike (the two floats after them left out, the mask last).

    DTensor never redistributes keyword arguments, and the mask is one (``attn_mask`` is
    keyword-only in these schemas): every strategy leaves it replicated, as it must already be,
    and shards only dimensions the mask broadcasts over (size 1, or one it lacks: it aligns
    with (batch, heads, L, S) from the right)."""
    from torch.distributed.tensor import Replicate, Shard

    dims = [0, 1]
    if attn_mask is not None:
        if not all(p.is_replicate() for p in attn_mask.placements):
            raise NotImplementedError(
                "scaled_dot_product_attention of DTensors on accel: the attention mask must be "
                f"replicated (its placements are {tuple(attn_mask.placements)}); DTensor does not "
                "redistribute it for this kernel: distribute it with [Replicate()]"
            )
        offset = 4 - attn_mask.ndim
        dims = [d for d in dims if d < offset or attn_mask.shape[d - offset] == 1]
    out: list[tuple[list, list]] = []
    for placement in [Replicate(), *(Shard(d) for d in dims)]:
        inputs: list[Any] = [placement] * tensors + [None, None]
        if attn_mask is not None:
            inputs.append(Replicate())
        out.append(([placement] * outputs, inputs))
    return out


def register() -> None:
    from torch.distributed.tensor.experimental import register_sharding

    from torch_accel import _torch_fixes

    aten = torch.ops.aten
    ops = [
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    ]

    @register_sharding(ops[0])
    def flash_attention_for_cpu(
        query: Any,
        key: Any,
        value: Any,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        attn_mask: Any = None,
        scale: float | None = None,
    ) -> list[tuple[list, list]]:
        return _strategies(3, 2, attn_mask)  # (output, logsumexp) from (query, key, value)

    @register_sharding(ops[1])
    def flash_attention_for_cpu_backward(
        grad_out: Any,
        query: Any,
        key: Any,
        value: Any,
        out: Any,
        logsumexp: Any,
        dropout_p: float,
        is_causal: bool,
        *,
        attn_mask: Any = None,
        scale: float | None = None,
    ) -> list[tuple[list, list]]:
        # (grad_query, grad_key, grad_value) from (grad_out, query, key, value, out, logsumexp)
        return _strategies(6, 3, attn_mask)

    for op in ops:
        _torch_fixes.dtensor_cache_key_includes(op, ["attn_mask"])
