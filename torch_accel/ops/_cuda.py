"""The fused operators' implementations for the cuda driver: Triton kernels (torch_accel/kernels)
on CUDA tensors.

accel's C++ kernels call these when the cuda driver runs (csrc/aten/fused_cuda.cpp): they view
the accel tensors as CUDA tensors on the same memory, make the accel stream PyTorch's current
CUDA stream, and call ``accel::_<op>_cuda`` with the results already allocated by accel's
allocator. The operators are defined here, in Python, because their implementations are; they
are internal (no autograd, no fake kernels: only the C++ kernels call them).
"""

from __future__ import annotations

import torch

_lib = torch.library.Library("accel", "FRAGMENT")
_lib.define(
    "_rms_norm_rope_cuda(Tensor x, Tensor weight, Tensor cos, Tensor sin, float eps, "
    "bool interleaved, Tensor(a!) out) -> ()"
)
_lib.define(
    "_rms_norm_rope_backward_cuda(Tensor grad, Tensor x, Tensor weight, Tensor cos, Tensor sin, "
    "float eps, bool interleaved, Tensor(a!) grad_x, Tensor(b!) grad_weight) -> ()"
)
_lib.define(
    "_qkv_rms_norm_rope_cuda(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos, "
    "Tensor sin, int num_q_heads, int num_kv_heads, float eps, Tensor(a!) q, Tensor(b!) k, "
    "Tensor(c!) v) -> ()"
)
_lib.define(
    "_qkv_rms_norm_rope_backward_cuda(Tensor? grad_q, Tensor? grad_k, Tensor? grad_v, "
    "Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, int num_q_heads, "
    "int num_kv_heads, float eps, Tensor(a!) grad_qkv, Tensor(b!) grad_q_weight, "
    "Tensor(c!) grad_k_weight) -> ()"
)
_lib.define(
    "_flash_attention_cuda(Tensor q, Tensor k, Tensor v, bool causal, float? scale, "
    "Tensor(a!) out, Tensor(b!) logsumexp) -> ()"
)
_lib.define(
    "_flash_attention_backward_cuda(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
    "Tensor logsumexp, bool causal, float? scale, Tensor(a!) grad_q, Tensor(b!) grad_k, "
    "Tensor(c!) grad_v) -> ()"
)


def _windows(qkv: torch.Tensor, hq: int, hkv: int) -> tuple[torch.Tensor, ...]:
    """q, k and v of qkv (n, seq, total) as (n, seq, heads, d) views."""
    n, s, total = qkv.shape
    d = total // (hq + 2 * hkv)
    rows = qkv.view(n, s, hq + 2 * hkv, d)
    return rows[:, :, :hq], rows[:, :, hq : hq + hkv], rows[:, :, hq + hkv :]


@torch.library.impl(_lib, "_rms_norm_rope_cuda", "CUDA")
def _rms_norm_rope_cuda(x, weight, cos, sin, eps, interleaved, out):  # type: ignore[no-untyped-def]
    from torch_accel.kernels import rope

    rope.rms_norm_rope_forward(x, weight, cos, sin, eps, interleaved, out)


@torch.library.impl(_lib, "_rms_norm_rope_backward_cuda", "CUDA")
def _rms_norm_rope_backward_cuda(grad, x, weight, cos, sin, eps, interleaved, grad_x, grad_weight):  # type: ignore[no-untyped-def]
    from torch_accel.kernels import rope

    grad_weight.copy_(
        rope.rms_norm_rope_backward(grad, x, weight, cos, sin, eps, interleaved, grad_x)
    )


@torch.library.impl(_lib, "_qkv_rms_norm_rope_cuda", "CUDA")
def _qkv_rms_norm_rope_cuda(qkv, q_weight, k_weight, cos, sin, hq, hkv, eps, q, k, v):  # type: ignore[no-untyped-def]
    from torch_accel.kernels import rope

    qi, ki, vi = _windows(qkv, hq, hkv)
    rope.rms_norm_rope_forward(qi, q_weight, cos, sin, eps, False, q, out_heads_first=True)
    rope.rms_norm_rope_forward(ki, k_weight, cos, sin, eps, False, k, out_heads_first=True)
    v.copy_(vi.transpose(1, 2))


@torch.library.impl(_lib, "_qkv_rms_norm_rope_backward_cuda", "CUDA")
def _qkv_rms_norm_rope_backward_cuda(  # type: ignore[no-untyped-def]
    grad_q, grad_k, grad_v, qkv, q_weight, k_weight, cos, sin, hq, hkv, eps, grad_qkv, gqw, gkw
):
    from torch_accel.kernels import rope

    qi, ki, _ = _windows(qkv, hq, hkv)
    gq, gk, gv = _windows(grad_qkv, hq, hkv)
    for grad, x, weight, out, gw in (
        (grad_q, qi, q_weight, gq, gqw),
        (grad_k, ki, k_weight, gk, gkw),
    ):
        if grad is None:
            out.zero_()
            gw.zero_()
        else:
            gw.copy_(rope.rms_norm_rope_backward(grad, x, weight, cos, sin, eps, False, out, True))
    if grad_v is None:
        gv.zero_()
    else:
        gv.copy_(grad_v.transpose(1, 2))


@torch.library.impl(_lib, "_flash_attention_cuda", "CUDA")
def _flash_attention_cuda(q, k, v, causal, scale, out, logsumexp):  # type: ignore[no-untyped-def]
    from torch_accel.kernels import attention

    attention.forward(q, k, v, causal, scale, out, logsumexp)


@torch.library.impl(_lib, "_flash_attention_backward_cuda", "CUDA")
def _flash_attention_backward_cuda(grad_out, q, k, v, out, logsumexp, causal, scale, gq, gk, gv):  # type: ignore[no-untyped-def]
    from torch_accel.kernels import attention

    dq, dk, dv = attention.backward(grad_out, q, k, v, out, logsumexp, causal, scale)
    gq.copy_(dq)
    gk.copy_(dk)
    gv.copy_(dv)
