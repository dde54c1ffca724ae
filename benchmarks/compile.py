"""torch.compile on accel against the CPU and against eager accel, measured in the same run.

(a) compiled accel against compiled CPU on the same functions (goal: ratio of times at least
    0.95, i.e. accel no more than 5% slower);
(b) compiled accel against eager accel on a pointwise-heavy block, bias + GELU + residual +
    layer norm (goal: at least 1.5x);
(a') flex_attention inference (causal block mask and a score_mod, 2x8x1024x64, float32) compiled
    on accel against compiled on the CPU: both Inductor's C++ flex template (goal as (a));
(c) one training step of the quickstart model (examples/transformer_lm.py) with
    backend="accel" against eager accel (goal: at least 2x): model and AdamW step compiled with
    backend="accel" (the optimizer capturable, as graph capture needs its step counts on the
    device), against eager model and eager foreach AdamW.

Each side is the best of several repeats, synchronized, the two sides timed in alternation; (a)
and (a') run the CPU and accel sides in processes of their own (see ratios.Side). Prints a table
and writes JSON (default benchmarks/results/compile.json).

    python benchmarks/compile.py [--json PATH]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from ratios import Make, Side, against_cpu, interleaved, report, serve

import torch_accel  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
GOALS = {
    "vs_compiled_cpu": 0.95,
    "flex_vs_compiled_cpu": 0.95,
    "vs_eager_block": 1.5,
    "train_step": 2.0,
}


def block(x: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x + b) + r, (x.shape[-1],))


def functions() -> dict[str, tuple[Callable[..., torch.Tensor], tuple[int, ...]]]:
    return {
        "pointwise": (lambda x, b, r: ((x * 2).sin() + b).relu() * r, (4096, 1024)),
        "reduction": (lambda x, b, r: (x * b).sum(-1) + r.amax(-1), (4096, 1024)),
        "block": (block, (4096, 1024)),
    }


def compiled(name: str) -> Make:
    """The compiled function ``name`` of functions() on a device, after three calls."""

    def make(device: str) -> Callable[[], object]:
        fn, shape = functions()[name]
        x = torch.randn(shape, device=device)
        b = torch.randn(shape[-1], device=device)
        r = torch.randn(shape, device=device)
        f = torch.compile(fn)
        for _ in range(3):
            f(x, b, r)
        return lambda: f(x, b, r)

    return make


def flex(device: str) -> Callable[[], object]:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return q >= k

    def bias(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        return s + 0.01 * (q - k)

    q, k, v = (torch.randn(2, 8, 1024, 64, device=device) for _ in range(3))
    mask = create_block_mask(causal, None, None, 1024, 1024, device=device)
    f = torch.compile(flex_attention)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return f(q, k, v, score_mod=bias, block_mask=mask)

    for _ in range(3):
        call()
    return call


# Compiled on accel against compiled on the CPU: each side in its own process (ratios.Side).
APART: dict[str, Make] = {f"compiled_{name}": compiled(name) for name in functions()}
APART["flex"] = flex


def block_vs_eager() -> tuple[float, float]:
    shape = (4096, 1024)
    x, b, r = (torch.randn(s, device="accel") for s in (shape, shape[-1:], shape))
    torch._dynamo.reset()
    f = torch.compile(block)
    for _ in range(3):
        f(x, b, r)
        block(x, b, r)
    return interleaved(lambda: block(x, b, r), lambda: f(x, b, r), 15)


def train_step() -> tuple[float, float]:
    sys.path.insert(0, str(ROOT / "examples"))
    from transformer_lm import BATCH, CONTEXT, VOCAB, TinyLM

    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (BATCH, CONTEXT + 1), device="accel")
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def make(graphed: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        model = TinyLM().to("accel")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True, capturable=graphed)
        forward, update = model, opt.step
        if graphed:
            forward = torch.compile(model, backend="accel")
            update = torch.compile(opt.step, backend="accel")

        def step() -> None:
            opt.zero_grad(set_to_none=False)
            logits = forward(inputs)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
            update()

        return step

    torch._dynamo.reset()
    eager, graphed = make(False), make(True)
    for _ in range(4):
        eager()
        graphed()
    return interleaved(eager, graphed, 15)


def main() -> int:
    if sys.argv[1:2] == ["--side"]:
        serve(APART, sys.argv[2])
        return 0
    sides = {device: Side(__file__, device) for device in ("cpu", "accel")}
    try:
        return report(
            __doc__.splitlines()[0],
            ROOT / "benchmarks/results/compile.json",
            [
                ("vs_compiled_cpu", against_cpu([f"compiled_{n}" for n in functions()], sides, 15)),
                ("flex_vs_compiled_cpu", against_cpu(["flex"], sides, 15)),
                ("vs_eager_block", block_vs_eager),
                ("train_step", train_step),
            ],
            GOALS,
            ("base", "accel", "ratio"),
        )
    finally:
        for side in sides.values():
            side.close()


if __name__ == "__main__":
    sys.exit(main())
