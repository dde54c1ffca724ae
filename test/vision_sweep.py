"""Every torchvision model on accel: one forward and backward against the CPU.

For each model of torchvision.models (classification, segmentation, detection, video, optical
flow; random weights, never downloaded) one forward and backward runs on accel, on the CPU in
float32 and on the CPU in float64 (the reference; RAFT: float32 on one thread). The loss is a
fixed random projection of every output (a plain sum after a training-mode BatchNorm has a
gradient of exactly zero upstream, which leaves both sides pure rounding noise). Dropout and
stochastic depth are off; BatchNorm trains (detection and optical flow models run in evaluation
mode, as they are used).

A model fails when an operator took the CPU fallback, or when accel's error against float64 is
more than ten times the float32 CPU's (plus a floor of 1e-6 of the largest gradient element,
1e-5 of the loss): float32 rounding makes both err, and deep models amplify it, so accel is
judged by the CPU's own error, not by a fixed tolerance. Models over 150M parameters are left
out (the host driver's default device holds 4 GiB).

    python test/vision_sweep.py [MODEL ...]      (make vision-sweep: all of them, ~15 min)

The exit status is 1 if any model failed or raised.
"""

from __future__ import annotations

import copy
import sys
import time
import warnings
from typing import Any

import torch
import torchvision
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map
from torchvision import models

import torch_accel

ACCEL = torch.device("accel")
KINDS = {
    "classification": models,
    "segmentation": models.segmentation,
    "detection": models.detection,
    "video": models.video,
    "optical_flow": models.optical_flow,
}
MAX_PARAMETERS = 150e6


def inputs(name: str, kind: str) -> list[Any]:
    g = torch.Generator().manual_seed(0)
    if kind == "video":
        size = {"s3d": (16, 224), "mvit_v1_b": (16, 224), "mvit_v2_s": (16, 224)}.get(name, (4, 64))
        return [torch.randn(1, 3, size[0], size[1], size[1], generator=g)]
    if kind == "optical_flow":  # RAFT needs at least 128x128
        return [torch.randn(1, 3, 128, 128, generator=g) for _ in range(2)]
    if kind == "detection":
        return [[torch.rand(3, 96, 96, generator=g)]]
    size = 64
    if name.startswith(("vit", "swin", "maxvit")):
        size = 224  # fixed patch grids
    elif name.startswith("inception"):
        size = 299
    elif name.startswith("googlenet"):
        size = 96
    return [torch.randn(2, 3, size, size, generator=g)]


def build(name: str, kind: str) -> nn.Module:
    kwargs: dict[str, Any] = {"num_classes": 10}
    if kind == "detection":
        kwargs = {"num_classes": 3, "weights_backbone": None}
    elif kind == "segmentation":
        kwargs = {"num_classes": 3, "weights_backbone": None, "aux_loss": None}
    elif kind in ("video", "optical_flow"):
        kwargs = {} if kind == "optical_flow" else {"num_classes": 10}
    torch.manual_seed(0)
    model = models.get_model(name, weights=None, **kwargs)
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model.eval() if kind in ("detection", "optical_flow") else model.train()


def loss_of(out: Any) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            w = torch.randn(t.shape, generator=torch.Generator().manual_seed(t.numel()))
            total = total + (t * w.to(t.device, t.dtype)).sum().double().cpu()
    return total


def run(model: nn.Module, x: list[Any]) -> torch.Tensor:
    loss = loss_of(model(*x))
    if loss.requires_grad:
        loss.backward()
    return loss.detach()


def sweep_one(name: str, kind: str) -> tuple[bool, str]:
    model = build(name, kind)
    if sum(p.numel() for p in model.parameters()) > MAX_PARAMETERS:
        return True, "left out (over 150M parameters)"
    # RAFT builds float32 coordinate grids whatever its weights: its reference is the float32
    # CPU on one thread (then the CPU's error is its run-to-run noise across thread counts).
    wide = torch.float32 if kind == "optical_flow" else torch.float64
    acc, ref = copy.deepcopy(model).to(ACCEL), copy.deepcopy(model).to(wide)
    x = inputs(name, kind)
    torch.accel.reset_fallback_stats()
    got = run(acc, tree_map(lambda t: t.to(ACCEL) if isinstance(t, torch.Tensor) else t, x))
    fallback = torch.accel.fallback_stats()
    cpu = run(model, x)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if wide == torch.float32 else threads)
    try:
        exact = run(ref, tree_map(lambda t: t.to(wide) if isinstance(t, torch.Tensor) else t, x))
    finally:
        torch.set_num_threads(threads)
    floor = 1e-5 * abs(exact.item()) + 1e-12
    loss_ratio = abs(got.item() - exact.item()) / (abs(cpu.item() - exact.item()) + floor)
    worst, worst_name = 0.0, ""
    pairs = zip(model.named_parameters(), acc.parameters(), ref.parameters(), strict=True)
    for (n, p), q, r in pairs:
        if p.grad is None or r.grad is None:
            continue
        e_accel = (q.grad.cpu().double() - r.grad).abs().max().item()
        e_cpu = (p.grad.double() - r.grad).abs().max().item()
        ratio = e_accel / (e_cpu + 1e-6 * r.grad.abs().max().item() + 1e-12)
        if ratio > worst:
            worst, worst_name = ratio, n
    ok = not fallback and loss_ratio <= 10 and worst <= 10
    what = f"loss error {loss_ratio:.2f}x the CPU's, worst gradient {worst:.2f}x ({worst_name})"
    return ok, what + (f", fell back: {fallback}" if fallback else "")


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    torch_accel._C._set_fallback_mode("silent")  # counted, then reported
    failed = []
    for kind, module in KINDS.items():
        for name in torchvision.models.list_models(module=module):
            if argv and name not in argv:
                continue
            start = time.perf_counter()
            try:
                ok, what = sweep_one(name, kind)
            except Exception as e:  # noqa: BLE001  (a model that raises is a failure)
                ok, what = False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            seconds = time.perf_counter() - start
            print(f"{'ok  ' if ok else 'FAIL'} {kind:14s} {name:34s} {what} ({seconds:.1f} s)")
            sys.stdout.flush()
            if not ok:
                failed.append(name)
    print(f"{len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
