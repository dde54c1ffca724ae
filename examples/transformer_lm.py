"""Quickstart: train a small transformer language model on accel and compare with the CPU.

A 2-layer decoder (width 128, token and position embeddings, causal self-attention through
scaled_dot_product_attention, GELU MLP, layer norm, cross-entropy loss, AdamW) trains for 50
steps on a synthetic next-token task, once on accel and once on the CPU from the same initial
weights and data. Every operator runs natively or as the underlying ATen kernel on accel
memory: the script checks that nothing took the copying CPU fallback, and that the losses match
the CPU run. ``--amp`` trains under torch.autocast("accel", dtype=torch.bfloat16) instead.

    python examples/transformer_lm.py [--steps 50] [--amp]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT, BATCH = 256, 128, 4, 2, 32, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=-1)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A learnable sequence task: each token is the previous one plus a per-row stride."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        stride = torch.randint(1, 8, (BATCH, 1), generator=g)
        seq = (start + stride * torch.arange(CONTEXT + 1)) % VOCAB
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def train(device: str, steps: int, amp: bool) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    start = time.perf_counter()
    for x, y in batches(steps):
        x, y = x.to(device), y.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast on both devices")
    args = parser.parse_args()

    torch.accel.reset_fallback_stats()
    accel_losses, accel_s = train("accel", args.steps, args.amp)
    fallbacks = torch.accel.fallback_stats()
    cpu_losses, cpu_s = train("cpu", args.steps, args.amp)

    for step in range(0, args.steps, 10):
        print(f"step {step:3d}  loss accel {accel_losses[step]:.4f}  cpu {cpu_losses[step]:.4f}")
    last = args.steps - 1
    print(f"step {last:3d}  loss accel {accel_losses[last]:.4f}  cpu {cpu_losses[last]:.4f}")
    print(f"time: accel {accel_s:.2f} s, cpu {cpu_s:.2f} s ({args.steps} steps)")
    worst = max(abs(a - b) for a, b in zip(accel_losses, cpu_losses, strict=True))
    tolerance = 5e-2 if args.amp else 1e-4
    ok = True
    if fallbacks:
        print(f"CPU fallback was used: {fallbacks}")
        ok = False
    if not worst <= tolerance or not all(math.isfinite(v) for v in accel_losses):
        print(f"losses differ from the CPU run by up to {worst:.2e} (tolerance {tolerance})")
        ok = False
    if accel_losses[-1] >= accel_losses[0]:
        print("the loss did not decrease")
        ok = False
    print(f"max |loss difference| {worst:.2e}; CPU fallback calls: {sum(fallbacks.values())}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
