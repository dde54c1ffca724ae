"""accel's fused operators against the unfused eager composition on the same device, measured in
the same run (issue 12's goals).

  rms_norm_rope      per-head RMSNorm then the rotary embedding (HF rotate_half), forward
                     (goal: at least 2x the composition), and forward plus backward
  qkv_rms_norm_rope  a fused QKV projection's output split, q and k normalized and rotated,
                     v passed through, in attention's layout (goal: at least 2.5x), and with
                     backward

  linear_act         gelu(x @ W^T + b) with the fused kernel (goal: at least 1.1x addmm then
                     gelu at 4096x4096x4096) and with auto, bf16

  flash_attention    on the cuda driver only: forward (goal: at least 0.9x) and backward (goal:
                     at least 0.8x) of torch's SDPA flash kernel on CUDA tensors of the same
                     GPU, bf16, batch 4, 32 heads, seq 4096, head dim 128, causal and not; prints
                     TFLOP/s (elsewhere: not measured, saying why)

Shapes are Qwen3-like (head dim 128, 16 query and 8 key/value heads) at seq 2048, in bfloat16
and float32. Prints a table of ratios and writes JSON (default
benchmarks/results/fused_ops.json).

    python benchmarks/fused_ops.py [--json PATH]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from ratios import interleaved, report

import torch_accel
from torch_accel.ops import linear_act, linear_kernel, qkv_rms_norm_rope, rms_norm_rope

ROOT = Path(__file__).resolve().parent.parent
ACCEL = torch.device("accel")
SEQ, HQ, HKV, D = 2048, 16, 8, 128
ROUNDS = 5


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def composition(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):  # type: ignore[no-untyped-def]
    """Qwen3RMSNorm then apply_rotary_pos_emb, as HF writes them (x: batch, seq, heads, d)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    y = w * h.to(dtype)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return (y * c) + (rotate_half(y) * s)


def qkv_composition(qkv, qw, kw, cos, sin):  # type: ignore[no-untyped-def]
    q, k, v = qkv.split([HQ * D, HKV * D, HKV * D], dim=-1)
    q = composition(q.unflatten(-1, (HQ, D)), qw, cos, sin).transpose(1, 2).contiguous()
    k = composition(k.unflatten(-1, (HKV, D)), kw, cos, sin).transpose(1, 2).contiguous()
    return q, k, v.unflatten(-1, (HKV, D)).transpose(1, 2).contiguous()


def with_backward(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> None:
        out = fn()
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return run


def rope_case(dtype: torch.dtype, backward: bool) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        x = torch.randn(1, SEQ, HQ, D, device=ACCEL, dtype=dtype, requires_grad=backward)
        w = torch.randn(D, device=ACCEL, dtype=dtype, requires_grad=backward)
        cos = torch.randn(SEQ, D, device=ACCEL, dtype=dtype)
        sin = torch.randn(SEQ, D, device=ACCEL, dtype=dtype)
        unfused: Callable[[], object] = lambda: composition(x, w, cos, sin)  # noqa: E731
        fused: Callable[[], object] = lambda: rms_norm_rope(x, w, cos, sin)  # noqa: E731
        if backward:
            unfused, fused = with_backward(unfused), with_backward(fused)
        return interleaved(unfused, fused, ROUNDS)

    return case


def qkv_case(dtype: torch.dtype, backward: bool) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        qkv = torch.randn(
            1, SEQ, (HQ + 2 * HKV) * D, device=ACCEL, dtype=dtype, requires_grad=backward
        )
        qw = torch.randn(D, device=ACCEL, dtype=dtype, requires_grad=backward)
        kw = torch.randn(D, device=ACCEL, dtype=dtype, requires_grad=backward)
        cos = torch.randn(SEQ, D, device=ACCEL, dtype=dtype)
        sin = torch.randn(SEQ, D, device=ACCEL, dtype=dtype)
        unfused: Callable[[], object] = lambda: qkv_composition(qkv, qw, kw, cos, sin)  # noqa: E731
        fused: Callable[[], object] = lambda: qkv_rms_norm_rope(qkv, qw, kw, cos, sin, HQ, HKV)  # noqa: E731
        if backward:
            unfused, fused = with_backward(unfused), with_backward(fused)
        return interleaved(unfused, fused, ROUNDS)

    return case


def linear_case(m: int, n: int, k: int, kernel: str) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        x = torch.randn(m, k, device=ACCEL, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=ACCEL, dtype=torch.bfloat16)
        b = torch.randn(n, device=ACCEL, dtype=torch.bfloat16)

        def fused() -> object:
            with linear_kernel(kernel):
                return linear_act(x, w, b, "gelu")

        unfused = lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))  # noqa: E731
        return interleaved(unfused, fused, 3)

    return case


def attention_case(causal: bool, backward: bool) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        from torch_accel.ops import flash_attention

        if torch_accel.driver() != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"needs the cuda driver and a GPU (driver {torch_accel.driver()})")
        shape = (4, 32, 4096, 128)
        qc, kc, vc = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
            for _ in range(3)
        )
        qa, ka, va = (t.detach().to(ACCEL).requires_grad_(backward) for t in (qc, kc, vc))
        native = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
            qc, kc, vc, is_causal=causal
        )
        ours = lambda: flash_attention(qa, ka, va, causal=causal)[0]  # noqa: E731
        if backward:
            native, ours = with_backward(native), with_backward(ours)
        base, measured = interleaved(native, ours, 5, device="both")
        flops = 4 * 4 * 32 * 4096 * 4096 * 128 * (0.5 if causal else 1.0) * (3.5 if backward else 1)
        tflops, native_tflops = flops / measured / 1e12, flops / base / 1e12
        print(f"  flash_attention causal={causal} backward={backward}: {tflops:.1f} TFLOP/s "
              f"(torch: {native_tflops:.1f})")  # fmt: skip
        return base, measured

    return case


def main() -> int:
    cases = []
    goals = {}
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        for backward in (False, True):
            suffix = f" {tag}" + (" fwd+bwd" if backward else "")
            cases.append(("rms_norm_rope" + suffix, rope_case(dtype, backward)))
            goals["rms_norm_rope" + suffix] = 1.0 if backward else 2.0
            cases.append(("qkv_rms_norm_rope" + suffix, qkv_case(dtype, backward)))
            goals["qkv_rms_norm_rope" + suffix] = 1.0 if backward else 2.5
    for m, n, k in ((4096, 4096, 4096), (256, 4096, 4096)):
        for kernel in ("fused", "auto"):
            name = f"linear_act gelu {m}x{n}x{k} bf16 {kernel}"
            cases.append((name, linear_case(m, n, k, kernel)))
            goals[name] = 1.1 if kernel == "fused" else 0.97  # auto: no slower
    for causal in (False, True):
        for backward in (False, True):
            name = f"flash_attention{' causal' if causal else ''}{' fwd+bwd' if backward else ''}"
            cases.append((name, attention_case(causal, backward)))
            goals[name] = 0.8 if backward else 0.9
    return report(
        __doc__.splitlines()[0],
        ROOT / "benchmarks/results/fused_ops.json",
        cases,
        goals,
        ("unfused", "fused", "speedup"),
    )


if __name__ == "__main__":
    sys.exit(main())
