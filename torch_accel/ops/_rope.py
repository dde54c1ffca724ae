"""accel::rms_norm_rope and accel::qkv_rms_norm_rope: wrappers, fake kernels and autograd."""

from __future__ import annotations

from typing import Any

import torch

_ops = torch.ops.accel


def rms_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
    interleaved: bool = False,
) -> torch.Tensor:
    """RMSNorm over the head dim, scaled by ``weight``, then the rotary embedding, in one pass.

    ``x`` is ``(..., seq, heads, head_dim)``; ``cos`` and ``sin`` are ``(seq, head_dim)`` or have
    leading dims that broadcast to ``x``'s (a batch dim). The rotation is HF's ``rotate_half``
    convention, or GPT-J's pairs with ``interleaved=True``. Computes in float32 and returns
    ``x``'s dtype and shape (contiguous).
    """
    return _ops.rms_norm_rope(x, weight, cos, sin, eps, interleaved)


def qkv_rms_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Splits a fused QKV projection's output ``(..., seq, (num_q_heads + 2*num_kv_heads) *
    head_dim)`` into q, k and v in one pass, q and k normalized (RMSNorm with ``q_weight``,
    ``k_weight``) and rotated (``rotate_half``). Returns q ``(..., num_q_heads, seq, head_dim)``,
    k and v ``(..., num_kv_heads, seq, head_dim)``, contiguous: the layout attention takes."""
    return _ops.qkv_rms_norm_rope(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps)


# --- fake kernels -----------------------------------------------------------------------------


def _check_rows(op: str, x: torch.Tensor, weight: torch.Tensor, d: int) -> None:
    torch._check(x.dim() >= 3, lambda: f"{op}: x must be (..., seq, heads, head_dim)")
    torch._check(d % 2 == 0, lambda: f"{op}: the head dim must be even, got {d}")
    torch._check(
        weight.dim() == 1 and weight.shape[0] == d,
        lambda: f"{op}: weight must have shape ({d},), got {tuple(weight.shape)}",
    )


@torch.library.register_fake("accel::rms_norm_rope")
def _rms_norm_rope_fake(x, weight, cos, sin, eps=1e-6, interleaved=False):  # type: ignore[no-untyped-def]
    _check_rows("accel::rms_norm_rope", x, weight, x.shape[-1] if x.dim() else 0)
    return x.new_empty(x.shape)


@torch.library.register_fake("accel::rms_norm_rope_backward")
def _rms_norm_rope_backward_fake(grad, x, weight, cos, sin, eps, interleaved):  # type: ignore[no-untyped-def]
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _qkv_shapes(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int) -> tuple[list[Any], int]:
    heads = num_q_heads + 2 * num_kv_heads
    torch._check(qkv.dim() >= 2, lambda: "accel::qkv_rms_norm_rope: qkv must be (..., seq, n*d)")
    torch._check(
        num_q_heads > 0 and num_kv_heads > 0 and num_q_heads % num_kv_heads == 0,
        lambda: "accel::qkv_rms_norm_rope: num_q_heads must be a positive multiple of num_kv_heads",
    )
    torch._check(
        qkv.shape[-1] % heads == 0,
        lambda: f"accel::qkv_rms_norm_rope: the last dim of qkv is not {heads} times a head dim",
    )
    return list(qkv.shape[:-2]), qkv.shape[-1] // heads


@torch.library.register_fake("accel::qkv_rms_norm_rope")
def _qkv_rms_norm_rope_fake(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps=1e-6):  # type: ignore[no-untyped-def]
    lead, d = _qkv_shapes(qkv, num_q_heads, num_kv_heads)
    seq = qkv.shape[-2]
    q = qkv.new_empty([*lead, num_q_heads, seq, d])
    k = qkv.new_empty([*lead, num_kv_heads, seq, d])
    return q, k, qkv.new_empty([*lead, num_kv_heads, seq, d])


@torch.library.register_fake("accel::qkv_rms_norm_rope_backward")
def _qkv_rms_norm_rope_backward_fake(  # type: ignore[no-untyped-def]
    grad_q, grad_k, grad_v, qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps
):
    return (
        qkv.new_empty(qkv.shape),
        q_weight.new_empty(q_weight.shape),
        k_weight.new_empty(k_weight.shape),
    )


# --- autograd -----------------------------------------------------------------------------------


def _rotate(y: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((-y[..., 1::2], y[..., 0::2]), dim=-1).flatten(-2)
    half = y.shape[-1] // 2
    return torch.cat((-y[..., half:], y[..., :half]), dim=-1)


def _trig_grads(
    ctx: Any,
    need: tuple[bool, bool],
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    cos: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of cos and sin where `need` asks (rarely: rotary tables are buffers),
    through the composition: grad (..., seq, heads, d) times the normalized rows, summed over
    the heads and over what cos broadcast."""
    need_cos, need_sin = need
    if not (need_cos or need_sin):
        return None, None
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + ctx.eps) * weight.float()
    g = grad.float()
    lead = cos.dim() - 2

    def reduce(t: torch.Tensor) -> torch.Tensor:
        t = t.sum(-2)  # over the heads
        extra = t.dim() - 2 - lead  # leading dims cos does not have
        if extra > 0:
            t = t.sum(dim=tuple(range(extra)))
        return t.sum_to_size(cos.shape).to(cos.dtype)

    gc = reduce(g * y) if need_cos else None
    gs = reduce(g * _rotate(y, ctx.interleaved)) if need_sin else None
    return gc, gs


def _sum(a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor | None:
    return b if a is None else a if b is None else a + b


def _rms_norm_rope_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, cos, sin, eps, interleaved = inputs
    ctx.save_for_backward(x, weight, cos, sin)
    ctx.eps, ctx.interleaved = eps, interleaved


def _rms_norm_rope_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, cos, sin = ctx.saved_tensors
    gx, gw = _ops.rms_norm_rope_backward(grad, x, weight, cos, sin, ctx.eps, ctx.interleaved)
    needs = ctx.needs_input_grad
    gc, gs = _trig_grads(ctx, needs[2:4], grad, x, weight, cos)
    return (gx if needs[0] else None, gw if needs[1] else None, gc, gs, None, None)


torch.library.register_autograd(
    "accel::rms_norm_rope", _rms_norm_rope_backward, setup_context=_rms_norm_rope_setup
)


def _qkv_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, eps = inputs
    ctx.save_for_backward(qkv, q_weight, k_weight, cos, sin)
    ctx.heads = (num_q_heads, num_kv_heads)
    ctx.eps, ctx.interleaved = eps, False


def _qkv_backward(ctx: Any, gq: Any, gk: Any, gv: Any) -> tuple[Any, ...]:
    qkv, q_weight, k_weight, cos, sin = ctx.saved_tensors
    hq, hkv = ctx.heads
    gqkv, gqw, gkw = _ops.qkv_rms_norm_rope_backward(
        gq, gk, gv, qkv, q_weight, k_weight, cos, sin, hq, hkv, ctx.eps
    )
    needs = ctx.needs_input_grad
    gc = gs = None
    d = qkv.shape[-1] // (hq + 2 * hkv)
    rows = qkv.unflatten(-1, (hq + 2 * hkv, d))
    for grad, first, count, weight in ((gq, 0, hq, q_weight), (gk, hq, hkv, k_weight)):
        if grad is None:
            continue
        window = rows[..., first : first + count, :]
        c, s = _trig_grads(ctx, needs[3:5], grad.transpose(-3, -2), window, weight, cos)
        gc, gs = _sum(gc, c), _sum(gs, s)
    return (
        gqkv if needs[0] else None,
        gqw if needs[1] else None,
        gkw if needs[2] else None,
        gc,
        gs,
        None,
        None,
        None,
    )


torch.library.register_autograd("accel::qkv_rms_norm_rope", _qkv_backward, setup_context=_qkv_setup)
