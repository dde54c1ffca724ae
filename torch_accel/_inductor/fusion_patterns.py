"""Rewrites of the unfused compositions in HF Llama/Qwen3 code into accel's fused operators, run
by accel's post-grad pass (passes.py) on the graphs Inductor compiles for accel:

- per-head RMSNorm then ``apply_rotary_pos_emb`` (Qwen3's ``q_norm``/``k_norm`` on
  ``(batch, seq, heads, head_dim)``, then the transpose to ``(batch, heads, seq, head_dim)`` and
  the rotary embedding with ``cos.unsqueeze(1)``; or without the transpose, ``cos.unsqueeze(2)``)
  into ``accel::rms_norm_rope``;
- ``act(F.linear(x, w, b))`` (relu, gelu, gelu tanh, silu) into ``accel::linear_act``, where
  linear_act would run its fused kernel (``linear_kernel("fused")``; on the host driver auto
  measures aten faster, and the rewrite would only cost Inductor its own fusions).

Patterns are traced once per process with PyTorch's pattern matcher. They match where the
composition's intermediate values have no other users: inference graphs, and forward graphs
whose backward does not read them (a training forward keeps the unfused composition, whose
intermediates the backward needs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._inductor.pattern_matcher import (
    Match,
    PatternMatcherPass,
    fwd_only,
    register_replacement,
)

from torch_accel import _C


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm's forward."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


# cos and sin enter the patterns already unsqueezed (apply_rotary_pos_emb shares the unsqueezed
# tables between q and k, so the unsqueeze cannot be part of either match).


def _rope_heads_first(x, weight, cos, sin, eps):  # type: ignore[no-untyped-def]
    y = _norm(x, weight, eps).transpose(1, 2)
    return (y * cos) + (_rotate_half(y) * sin)


def _rope_heads_first_fused(x, weight, cos, sin, eps):  # type: ignore[no-untyped-def]
    op = torch.ops.accel.rms_norm_rope
    return op(x, weight, cos.squeeze(1), sin.squeeze(1), eps).transpose(1, 2)


def _rope_seq_first(x, weight, cos, sin, eps):  # type: ignore[no-untyped-def]
    y = _norm(x, weight, eps)
    return (y * cos) + (_rotate_half(y) * sin)


def _rope_seq_first_fused(x, weight, cos, sin, eps):  # type: ignore[no-untyped-def]
    return torch.ops.accel.rms_norm_rope(x, weight, cos.squeeze(2), sin.squeeze(2), eps)


def _rope_applies(heads_dim: int) -> Callable[[Match], bool]:
    """The fused operator computes what the composition computes: one dtype throughout (the
    composition would promote a float32 weight), an even head dim, cos and sin of (batch or 1,
    seq, d) with a size-1 heads dim at `heads_dim`."""

    def check(match: Match) -> bool:
        vals = [match.kwargs[n].meta.get("val") for n in ("x", "weight", "cos", "sin")]
        if not all(isinstance(t, torch.Tensor) for t in vals):
            return False
        x, w, cos, sin = vals
        return (
            x.dim() == 4
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and w.dtype == cos.dtype == sin.dtype == x.dtype
            and w.dim() == 1
            and cos.dim() == 4
            and cos.shape[heads_dim] == 1
            and cos.shape == sin.shape
            and x.shape[-1] % 2 == 0
        )

    return check


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.nn.functional.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def _trace(fn: Callable[..., Any], args: Any) -> torch.fx.GraphModule:
    """fwd_only, with views as reshapes: Inductor turns every view into a reshape before the
    post-grad passes, so the patterns must show them as such."""
    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = fwd_only(fn, args)
    view_to_reshape(gm)
    return gm


def _linear_applies(match: Match) -> bool:
    return _C._get_linear_kernel() == "fused"


def _register_linear(pass_: PatternMatcherPass, name: str) -> None:
    act = _ACTIVATIONS[name]

    def search(x, weight, bias):  # type: ignore[no-untyped-def]
        return act(torch.nn.functional.linear(x, weight, bias))

    def replace(x, weight, bias):  # type: ignore[no-untyped-def]
        return torch.ops.accel.linear_act(x, weight, bias, name)

    def search_nobias(x, weight):  # type: ignore[no-untyped-def]
        return act(torch.nn.functional.linear(x, weight))

    def replace_nobias(x, weight):  # type: ignore[no-untyped-def]
        return torch.ops.accel.linear_act(x, weight, None, name)

    w, b = torch.empty(6, 8), torch.empty(6)
    for x in (torch.empty(4, 8), torch.empty(2, 4, 8)):
        register_replacement(search, replace, [x, w, b], _trace, pass_, _linear_applies)
        register_replacement(search_nobias, replace_nobias, [x, w], _trace, pass_, _linear_applies)


@functools.cache
def patterns() -> PatternMatcherPass:
    pass_ = PatternMatcherPass(pass_name="accel_fusion_patterns")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.empty(2, 5, 3, 8, dtype=dtype)
        w = torch.empty(8, dtype=dtype)
        for search, replace, heads_dim in (
            (_rope_heads_first, _rope_heads_first_fused, 1),
            (_rope_seq_first, _rope_seq_first_fused, 2),
        ):
            table = torch.empty(2, 5, 8, dtype=dtype).unsqueeze(heads_dim)
            register_replacement(
                search,
                replace,
                [x, w, table, table.clone()],
                _trace,
                pass_,
                _rope_applies(heads_dim),
                scalar_workaround={"eps": 1e-6},
            )
    for name in _ACTIVATIONS:
        _register_linear(pass_, name)
    return pass_


def apply(gm: torch.fx.GraphModule) -> int:
    """Rewrites the compositions in ``gm``; returns how many were replaced."""
    return patterns().apply(gm.graph)


def cache_key() -> Any:
    """What the rewrite depends on beyond this file's source (Inductor's caches)."""
    return _C._get_linear_kernel()
