"""Triton flash attention (forward and backward) for accel::flash_attention on CUDA tensors.

(batch, heads, seq, head_dim) with any strides but a contiguous head_dim; grouped-query heads
(q head h reads kv head h // (q heads / kv heads)); causal aligned at the start (query i sees
keys 0..i), as SDPA's is_causal. The forward keeps a running max and sum per row (O(seq)
memory) and returns the log-sum-exp; the backward recomputes the probabilities from it, one
kernel for dK and dV (per q head, summed over each group afterwards) and one for dQ, so no
atomics and deterministic sums.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _rows(ptr, rows, stride, dims, limit):  # type: ignore[no-untyped-def]
    """The block [rows, dims] of a (seq, D) matrix, zeros past `limit` rows."""
    return tl.load(ptr + rows[:, None] * stride + dims[None, :], mask=rows[:, None] < limit,
                   other=0.0)  # fmt: skip


@triton.jit
def _cols(ptr, cols, stride, dims, limit):  # type: ignore[no-untyped-def]
    """The block [dims, cols]: rows `cols` of a (seq, D) matrix, transposed."""
    return tl.load(ptr + cols[None, :] * stride + dims[:, None], mask=cols[None, :] < limit,
                   other=0.0)  # fmt: skip


@triton.jit
def _fwd(  # type: ignore[no-untyped-def]
    Q, K, V, Out, LSE, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
    H, GROUP, SQ, SK,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kh = h // GROUP
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    cols0 = tl.arange(0, BLOCK_N)
    q = _rows(Q + b * sqb + h * sqh, rows, sqs, dims, SQ)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    den = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
    hi = SK
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # the keys past SK are masked
    for start_n in tl.range(0, hi, BLOCK_N):
        cols = start_n + cols0
        kt = _cols(K + b * skb + kh * skh, cols, sks, dims, SK)
        s = tl.dot(q, kt) * qk_scale
        keep = cols[None, :] < SK
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        den = den * alpha + tl.sum(p, 1)
        v = _rows(V + b * svb + kh * svh, cols, svs, dims, SK)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    acc = acc / den[:, None]
    tl.store(Out + b * sob + h * soh + rows[:, None] * sos + dims[None, :],
             acc.to(Out.dtype.element_ty), mask=rows[:, None] < SQ)  # fmt: skip
    tl.store(LSE + bh * SQ + rows, (m + tl.log2(den)) * 0.6931471805599453, mask=rows < SQ)


@triton.jit
def _probabilities(q, kt, lse, rows, cols, SK, scale, CAUSAL: tl.constexpr):  # type: ignore[no-untyped-def]
    s = tl.dot(q, kt) * scale
    p = tl.exp(s - lse[:, None])
    keep = cols[None, :] < SK
    if CAUSAL:
        keep = keep & (rows[:, None] >= cols[None, :])
    return tl.where(keep, p, 0.0)


@triton.jit
def _bwd_kv(  # type: ignore[no-untyped-def]
    Q, K, V, DO, LSE, DELTA, DK, DV, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    H, GROUP, SQ, SK,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """dK and dV of one block of keys for one q head (float32, (batch, q heads, SK, D))."""
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kh = h // GROUP
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    rows0 = tl.arange(0, BLOCK_M)
    kt = _cols(K + b * skb + kh * skh, cols, sks, dims, SK)
    v = _rows(V + b * svb + kh * svh, cols, svs, dims, SK)
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    lo = 0
    if CAUSAL:
        lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in tl.range(lo, SQ, BLOCK_M):
        rows = start_m + rows0
        q = _rows(Q + b * sqb + h * sqh, rows, sqs, dims, SQ)
        do = _rows(DO + b * sdb + h * sdh, rows, sds, dims, SQ)
        lse = tl.load(LSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
        delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
        p = _probabilities(q, kt, lse, rows, cols, SK, scale, CAUSAL)
        p = tl.where(rows[:, None] < SQ, p, 0.0)
        dv += tl.dot(tl.trans(p).to(do.dtype), do)
        dp = tl.dot(do, v.to(do.dtype).trans()).to(tl.float32)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds).to(q.dtype), q)
    out = bh * SK * D + cols[:, None] * D + dims[None, :]
    tl.store(DK + out, dk * scale, mask=cols[:, None] < SK)
    tl.store(DV + out, dv, mask=cols[:, None] < SK)


@triton.jit
def _bwd_q(  # type: ignore[no-untyped-def]
    Q, K, V, DO, LSE, DELTA, DQ, scale,
    sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sdb, sdh, sds,
    H, GROUP, SQ, SK,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    """dQ of one block of queries (into DQ, q's layout, (batch, heads, SQ, D) contiguous)."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kh = h // GROUP
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    cols0 = tl.arange(0, BLOCK_N)
    q = _rows(Q + b * sqb + h * sqh, rows, sqs, dims, SQ)
    do = _rows(DO + b * sdb + h * sdh, rows, sds, dims, SQ)
    lse = tl.load(LSE + bh * SQ + rows, mask=rows < SQ, other=0.0)
    delta = tl.load(DELTA + bh * SQ + rows, mask=rows < SQ, other=0.0)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    hi = SK
    if CAUSAL:
        hi = (start_m + 1) * BLOCK_M  # the keys past SK are masked
    for start_n in tl.range(0, hi, BLOCK_N):
        cols = start_n + cols0
        kt = _cols(K + b * skb + kh * skh, cols, sks, dims, SK)
        vt = _cols(V + b * svb + kh * svh, cols, svs, dims, SK)
        p = _probabilities(q, kt, lse, rows, cols, SK, scale, CAUSAL)
        dp = tl.dot(do, vt.to(do.dtype)).to(tl.float32)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt))
    tl.store(DQ + bh * SQ * D + rows[:, None] * D + dims[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=rows[:, None] < SQ)  # fmt: skip


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int]:
    d = q.shape[-1]
    if d not in (16, 32, 64, 128, 256):
        raise NotImplementedError(f"the Triton flash attention takes head dims 16..256 (powers "
                                  f"of two), got {d}")  # fmt: skip
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("flash attention needs a contiguous head dim")
    return q.shape[1], q.shape[1] // k.shape[1]


def _blocks(d: int) -> tuple[int, int]:
    return (64, 64) if d <= 64 else (64, 32)


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
    out: torch.Tensor, lse: torch.Tensor,
) -> None:  # fmt: skip
    """Writes the attention output into `out` (q's shape) and the rows' natural log-sum-exp
    into `lse` (float32, (batch, heads, seq), contiguous)."""
    heads, group = _check(q, k, v)
    b, _, sq, d = q.shape
    sk = k.shape[2]
    bm, bn = _blocks(d)
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    _fwd[(triton.cdiv(sq, bm), b * heads)](
        q, k, v, out, lse, sc, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
        k.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1),
        out.stride(2), heads, group, sq, sk, CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, D=d,
    )  # fmt: skip


def backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    heads, group = _check(q, k, v)
    b, _, sq, d = q.shape
    kv_heads, sk = k.shape[1], k.shape[2]
    bm, bn = _blocks(d)
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    do = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    delta = (out.float() * do.float()).sum(-1).contiguous()
    lse = lse.contiguous()
    strides = (
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
    )  # fmt: skip
    dk = torch.empty(b, heads, sk, d, device=q.device, dtype=torch.float32)
    dv = torch.empty_like(dk)
    _bwd_kv[(triton.cdiv(sk, bn), b * heads)](
        q, k, v, do, lse, delta, dk, dv, sc, *strides, heads, group, sq, sk,
        CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, D=d,
    )  # fmt: skip
    dq = torch.empty(b, heads, sq, d, device=q.device, dtype=q.dtype)
    _bwd_q[(triton.cdiv(sq, bm), b * heads)](
        q, k, v, do, lse, delta, dq, sc, *strides, heads, group, sq, sk,
        CAUSAL=causal, BLOCK_M=bm, BLOCK_N=bn, D=d,
    )  # fmt: skip
    # The q heads of each group add up to their kv head's gradients.
    dk = dk.view(b, kv_heads, group, sk, d).sum(2).to(k.dtype)
    dv = dv.view(b, kv_heads, group, sk, d).sum(2).to(v.dtype)
    return dq, dk, dv
