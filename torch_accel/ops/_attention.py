"""accel::flash_attention: wrapper, fake kernels and autograd."""

from __future__ import annotations

from typing import Any

import torch

_ops = torch.ops.accel


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q @ k.T * scale) @ v`` over ``(batch, heads, seq, head_dim)`` tensors
    with memory O(seq) beyond inputs and outputs. ``k`` and ``v`` may have fewer heads than ``q``
    (grouped-query attention: their heads divide q's). ``causal`` masks keys after each query
    (aligned at the start, as ``is_causal`` in SDPA); ``scale`` defaults to ``1/sqrt(head_dim)``.
    Returns the output (q's shape and dtype) and the log-sum-exp of each row (float32,
    ``(batch, heads, seq)``)."""
    return _ops.flash_attention(q, k, v, causal, scale)


@torch.library.register_fake("accel::flash_attention")
def _flash_attention_fake(q, k, v, causal=False, scale=None):  # type: ignore[no-untyped-def]
    torch._check(q.dim() == 4, lambda: "accel::flash_attention: q must be 4-d")
    torch._check(
        k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0,
        lambda: "accel::flash_attention: the kv heads must divide the q heads",
    )
    # Results are contiguous on every driver.
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake("accel::flash_attention_backward")
def _flash_attention_backward_fake(grad_out, q, k, v, out, logsumexp, causal, scale):  # type: ignore[no-untyped-def]
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    gq, gk, gv = _ops.flash_attention_backward(grad_out, q, k, v, out, lse, ctx.causal, ctx.scale)
    return gq, gk, gv, None, None


torch.library.register_autograd("accel::flash_attention", _backward, setup_context=_setup)
