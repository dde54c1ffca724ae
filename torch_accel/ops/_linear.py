"""accel::linear_act: a linear layer with its activation, and the choice of implementation."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from torch_accel import _C

_ops = torch.ops.accel
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
# Activations whose derivative reads the pre-activation (relu's reads the output, none's nothing).
_NEEDS_PRE = ("gelu", "gelu_tanh", "silu")
KERNELS = ("auto", "fused", "aten")


def _kernel_from_env() -> None:
    value = os.environ.get("ACCEL_LINEAR_KERNEL", "")
    if value == "":
        return
    if value not in KERNELS:
        raise ImportError(f"ACCEL_LINEAR_KERNEL={value!r} is not one of {', '.join(KERNELS)}")
    _C._set_linear_kernel(value)


_kernel_from_env()


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
) -> torch.Tensor:
    """``activation(x @ weight.T + bias)``, activation one of ``none``, ``relu``, ``gelu``,
    ``gelu_tanh`` (``approximate="tanh"``) and ``silu``.

    Which implementation runs follows :func:`linear_kernel` (``ACCEL_LINEAR_KERNEL``): ``fused``
    applies bias and activation to each panel of the product while it is in cache, ``aten`` is
    ``addmm`` then the activation, ``auto`` picks the faster for the shape. Where autograd needs
    it, the pre-activation is kept for the backward (as the unfused composition keeps it).
    """
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)
    ):
        return _ops.linear_act_forward(x, weight, bias, activation)[0]
    return _ops.linear_act(x, weight, bias, activation)


def get_linear_kernel() -> str:
    """The implementation :func:`linear_act` uses: ``"auto"``, ``"fused"`` or ``"aten"``."""
    return _C._get_linear_kernel()


@contextlib.contextmanager
def linear_kernel(kernel: str) -> Iterator[None]:
    """Within the block, :func:`linear_act` uses ``kernel`` (``"auto"``, ``"fused"`` or
    ``"aten"``); the previous choice is restored afterwards. The choice is per process (the
    backward runs on autograd's device threads), like ``ACCEL_LINEAR_KERNEL``."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {', '.join(KERNELS)}, not {kernel!r}")
    previous = _C._get_linear_kernel()
    _C._set_linear_kernel(kernel)
    try:
        yield
    finally:
        _C._set_linear_kernel(previous)


# --- fake kernels -----------------------------------------------------------------------------


def _out_shape(x: torch.Tensor, weight: torch.Tensor, activation: str) -> list[Any]:
    torch._check(
        activation in ACTIVATIONS, lambda: f"accel::linear_act: unknown activation {activation!r}"
    )
    torch._check(weight.dim() == 2, lambda: "accel::linear_act: weight must be 2-d")
    torch._check(
        x.shape[-1] == weight.shape[1],
        lambda: f"accel::linear_act: x has {x.shape[-1]} features, weight is {tuple(weight.shape)}",
    )
    return [*x.shape[:-1], weight.shape[0]]


@torch.library.register_fake("accel::linear_act")
def _linear_act_fake(x, weight, bias=None, activation="none"):  # type: ignore[no-untyped-def]
    return x.new_empty(_out_shape(x, weight, activation))


@torch.library.register_fake("accel::linear_act_forward")
def _linear_act_forward_fake(x, weight, bias, activation):  # type: ignore[no-untyped-def]
    shape = _out_shape(x, weight, activation)
    keeps_pre = activation in _NEEDS_PRE
    return x.new_empty(shape), x.new_empty(shape if keeps_pre else [0])


@torch.library.register_fake("accel::linear_act_backward")
def _linear_act_backward_fake(grad, x, weight, saved, activation, has_bias):  # type: ignore[no-untyped-def]
    gb = weight.new_empty([weight.shape[0]]) if has_bias else None
    return x.new_empty(x.shape), weight.new_empty(weight.shape), gb


# --- autograd -----------------------------------------------------------------------------------


def _saved_for(activation: str, out: torch.Tensor, pre: torch.Tensor | None) -> torch.Tensor:
    if activation == "relu":
        return out
    if activation == "none":
        return out.new_empty(0)
    assert pre is not None
    return pre


def _grads(
    ctx: Any, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, saved: torch.Tensor
) -> tuple[Any, ...]:
    gx, gw, gb = _ops.linear_act_backward(grad, x, weight, saved, ctx.activation, ctx.has_bias)
    needs = ctx.needs_input_grad
    return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None, None)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return _grads(ctx, grad, *ctx.saved_tensors)


def _forward_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias, activation = inputs
    out, pre = output
    ctx.save_for_backward(x, weight, _saved_for(activation, out, pre))
    ctx.activation, ctx.has_bias = activation, bias is not None


def _forward_backward(ctx: Any, grad: torch.Tensor, grad_pre: torch.Tensor | None) -> Any:
    return _backward(ctx, grad)


torch.library.register_autograd(
    "accel::linear_act_forward", _forward_backward, setup_context=_forward_setup
)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    """torch.ops.accel.linear_act called directly with inputs that need gradients: the
    pre-activation was not kept, so the backward recomputes it (torch_accel.ops.linear_act
    keeps it instead)."""
    x, weight, bias, activation = inputs
    ctx.save_for_backward(x, weight, bias, output)
    ctx.activation, ctx.has_bias = activation, bias is not None


def _recomputing_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    x, weight, bias, output = ctx.saved_tensors
    pre = None
    if ctx.activation in _NEEDS_PRE:
        pre = torch.nn.functional.linear(x, weight, bias)
    return _grads(ctx, grad, x, weight, _saved_for(ctx.activation, output, pre))


torch.library.register_autograd("accel::linear_act", _recomputing_backward, setup_context=_setup)
