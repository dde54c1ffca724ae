"""Triton kernels of rms_norm_rope and qkv_rms_norm_rope (forward and backward).

One program per row (a head's vector of head_dim values); rows are (n, s, h) with a stride
each, so the same kernel reads a fused projection's q or k window and writes heads-first
results. The rotation pairs element a with b: (j, j + d/2) for rotate_half, (2j, 2j + 1)
interleaved; out[a] = y[a]*cos[a] - y[b]*sin[a], out[b] = y[b]*cos[b] + y[a]*sin[b].
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _forward(  # type: ignore[no-untyped-def]
    x, out, w, cos, sin,
    S, H, xsn, xss, xsh, osn, oss, osh, csn, css,
    eps, D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    h, s, n = r % H, (r // H) % S, r // (H * S)
    xb, ob, cb = n * xsn + s * xss + h * xsh, n * osn + s * oss + h * osh, n * csn + s * css
    j = tl.arange(0, HALF)
    a, b = (2 * j, 2 * j + 1) if INTERLEAVED else (j, j + HALF)
    xa = tl.load(x + xb + a).to(tl.float32)
    xbv = tl.load(x + xb + b).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(xa * xa, 0) + tl.sum(xbv * xbv, 0)) / D + eps)
    ya = xa * rstd * tl.load(w + a).to(tl.float32)
    yb = xbv * rstd * tl.load(w + b).to(tl.float32)
    ca, cbv = tl.load(cos + cb + a).to(tl.float32), tl.load(cos + cb + b).to(tl.float32)
    sa, sbv = tl.load(sin + cb + a).to(tl.float32), tl.load(sin + cb + b).to(tl.float32)
    tl.store(out + ob + a, (ya * ca - yb * sa).to(out.dtype.element_ty))
    tl.store(out + ob + b, (yb * cbv + ya * sbv).to(out.dtype.element_ty))


@triton.jit
def _backward(  # type: ignore[no-untyped-def]
    x, g, gx, w, cos, sin, partial,
    S, H, xsn, xss, xsh, gsn, gss, gsh, osn, oss, osh, csn, css, rows, ROWS: tl.constexpr,
    eps, D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    """ROWS rows per program; the program's sum of grad_weight goes to partial[pid]."""
    pid = tl.program_id(0)
    j = tl.arange(0, HALF)
    a, b = (2 * j, 2 * j + 1) if INTERLEAVED else (j, j + HALF)
    wa, wb = tl.load(w + a).to(tl.float32), tl.load(w + b).to(tl.float32)
    dwa = tl.zeros([HALF], dtype=tl.float32)
    dwb = tl.zeros([HALF], dtype=tl.float32)
    for i in range(ROWS):
        r = pid * ROWS + i
        if r < rows:
            h, s, n = r % H, (r // H) % S, r // (H * S)
            xb, gb = n * xsn + s * xss + h * xsh, n * gsn + s * gss + h * gsh
            ob, cb = n * osn + s * oss + h * osh, n * csn + s * css
            xa = tl.load(x + xb + a).to(tl.float32)
            xbv = tl.load(x + xb + b).to(tl.float32)
            rstd = tl.rsqrt((tl.sum(xa * xa, 0) + tl.sum(xbv * xbv, 0)) / D + eps)
            na, nb = xa * rstd, xbv * rstd
            ga, gbv = tl.load(g + gb + a).to(tl.float32), tl.load(g + gb + b).to(tl.float32)
            ca, cbv = tl.load(cos + cb + a).to(tl.float32), tl.load(cos + cb + b).to(tl.float32)
            sa, sbv = tl.load(sin + cb + a).to(tl.float32), tl.load(sin + cb + b).to(tl.float32)
            # dy = g*c - rotate(g*s): the rotation's transpose is minus itself.
            dya = ga * ca + gbv * sbv
            dyb = gbv * cbv - ga * sa
            dwa += dya * na
            dwb += dyb * nb
            dna, dnb = dya * wa, dyb * wb
            mean = (tl.sum(dna * na, 0) + tl.sum(dnb * nb, 0)) / D
            tl.store(gx + ob + a, (rstd * (dna - na * mean)).to(gx.dtype.element_ty))
            tl.store(gx + ob + b, (rstd * (dnb - nb * mean)).to(gx.dtype.element_ty))
    tl.store(partial + pid * D + a, dwa)
    tl.store(partial + pid * D + b, dwb)


def _rows(t: torch.Tensor, heads_first: bool = False) -> tuple[int, int, int]:
    """(n, s, h) strides of a 4-d tensor (n, s, h, d), or (n, h, s, d) when heads_first."""
    return (t.stride(0), t.stride(2), t.stride(1)) if heads_first else t.stride()[:3]


def _check_head_dim(d: int) -> None:
    if d % 2 or (d // 2) & (d // 2 - 1):
        raise NotImplementedError(
            f"the Triton rope kernels take head dims of twice a power of two, got {d}"
        )


def _tables(cos: torch.Tensor, sin: torch.Tensor, n: int, s: int, d: int):  # type: ignore[no-untyped-def]
    """cos and sin as float32 (n, s, d) views (a broadcast batch has stride 0), one set of
    strides for both."""
    c, sn = cos.float(), sin.float()
    if c.dim() == 2:
        c, sn = c.unsqueeze(0), sn.unsqueeze(0)
    c, sn = c.expand(n, s, d), sn.expand(n, s, d)
    if c.stride() != sn.stride() or c.stride(2) != 1:
        c, sn = c.contiguous(), sn.contiguous()
    return c, sn


def rms_norm_rope_forward(
    x4: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    eps: float, interleaved: bool, out4: torch.Tensor, out_heads_first: bool = False,
) -> None:  # fmt: skip
    """Rows of x4 (n, s, h, d), last dim contiguous, into out4 ((n, s, h, d), or (n, h, s, d)
    with out_heads_first). cos and sin: (s, d) or (n or 1, s, d)."""
    n, s, h, d = x4.shape
    _check_head_dim(d)
    c, sn = _tables(cos, sin, n, s, d)
    w = weight.float().contiguous()
    _forward[(n * s * h,)](
        x4, out4, w, c, sn, s, h, *_rows(x4), *_rows(out4, out_heads_first),
        c.stride(0), c.stride(1), eps, D=d, HALF=d // 2, INTERLEAVED=interleaved,
    )  # fmt: skip


def rms_norm_rope_backward(
    grad4: torch.Tensor, x4: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor,
    sin: torch.Tensor, eps: float, interleaved: bool, grad_x4: torch.Tensor,
    grad_heads_first: bool = False,
) -> torch.Tensor:  # fmt: skip
    """grad_x into grad_x4 (x4's layout); returns grad_weight (float32). grad4 is (n, s, h, d),
    or (n, h, s, d) with grad_heads_first."""
    n, s, h, d = x4.shape
    _check_head_dim(d)
    c, sn = _tables(cos, sin, n, s, d)
    w = weight.float().contiguous()
    rows = n * s * h
    per = max(1, triton.cdiv(rows, 1024))
    programs = triton.cdiv(rows, per)
    partial = torch.empty(programs, d, device=x4.device, dtype=torch.float32)
    _backward[(programs,)](
        x4, grad4, grad_x4, w, c, sn, partial, s, h, *_rows(x4),
        *_rows(grad4, grad_heads_first), *_rows(grad_x4), c.stride(0), c.stride(1), rows,
        ROWS=per, eps=eps, D=d, HALF=d // 2, INTERLEAVED=interleaved,
    )  # fmt: skip
    return partial.sum(0)
