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
from collections.abc import Callable
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
    return judge(model, inputs(name, kind), wide)


def judge(model: nn.Module, x: list[Any], wide: torch.dtype = torch.float64) -> tuple[bool, str]:
    """One forward and backward of model (on the CPU, float32) on accel, on the CPU and in wide
    on the CPU (the reference): whether accel's errors against the reference are within ten
    times the CPU's and no operator fell back, and what was measured.

    The CPU's error depends on its reduction order, so on its thread count: a gradient that is a
    long sum (a BatchNorm's bias over a batch, a scalar scale) can be exact by luck on two
    threads and as far off as accel on one. So a model that fails on the CPU's error with its
    threads is judged again against the worse of that and the CPU's error on one thread."""
    acc, ref = copy.deepcopy(model).to(ACCEL), copy.deepcopy(model).to(wide)
    torch.accel.reset_fallback_stats()
    got = run_of(acc, x, ACCEL)
    fallback = torch.accel.fallback_stats()
    exact = run_of(ref, x, "cpu", threads=1 if wide == torch.float32 else None)
    accel, cpu = errors(got, exact), errors(run_of(copy.deepcopy(model), x, "cpu"), exact)
    verdict = compare(accel, cpu, exact)
    if verdict[0] > 10 and wide == torch.float64:
        one = errors(run_of(copy.deepcopy(model), x, "cpu", threads=1), exact)
        verdict = compare(accel, {n: max(e, one[n]) for n, e in cpu.items()}, exact)
    worst, worst_name, loss_ratio = verdict
    ok = not fallback and worst <= 10
    what = f"loss error {loss_ratio:.2f}x the CPU's, worst {worst:.2f}x ({worst_name})"
    return ok, what + (f", fell back: {fallback}" if fallback else "")


# run_of(): {"": the loss, parameter name: its gradient} of one forward and backward
Run = dict[str, torch.Tensor]


def run_of(model: nn.Module, x: list[Any], device: Any, threads: int | None = None) -> Run:
    """The loss and the gradients of one forward and backward of model on device, in the
    model's dtype (threads: the CPU's thread count during the run)."""
    dtype = next(model.parameters()).dtype
    moved = tree_map(
        lambda t: (
            t.to(device, dtype if t.is_floating_point() else t.dtype)
            if isinstance(t, torch.Tensor)
            else t
        ),
        x,
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        loss = run(model.to(device), moved)
    finally:
        torch.set_num_threads(before)
    out = {"": loss.double()}
    for n, p in model.named_parameters():
        if p.grad is not None:
            out[n] = p.grad.detach().cpu().double()
    return out


def errors(got: Run, exact: Run) -> dict[str, float]:
    """The largest absolute error of each of got's values against exact."""
    return {n: (t - exact[n]).abs().max().item() for n, t in got.items() if n in exact}


def compare(got: dict[str, float], cpu: dict[str, float], exact: Run) -> tuple[float, str, float]:
    """(the worst ratio of accel's error to the CPU's over the loss and the gradients, where,
    the loss's ratio)."""
    worst, worst_name, loss_ratio = 0.0, "", 0.0
    # Floors: 1e-5 of the loss; 1e-6 of the gradient's largest element plus float32's resolution
    # of the model's largest gradient element (a gradient that cancels to zero, as a softmax's
    # input bias, is rounding noise of that scale on the CPU and on accel alike).
    largest = max((t.abs().max().item() for n, t in exact.items() if n), default=0.0)
    for n, e in got.items():
        big = exact[n].abs().max().item()
        floor = (1e-5 * big if n == "" else 1e-6 * big + 1e-7 * largest) + 1e-12
        ratio = e / (cpu.get(n, 0.0) + floor)
        if n == "":
            loss_ratio = ratio
        if ratio > worst:
            worst, worst_name = ratio, n or "loss"
    return worst, worst_name, loss_ratio


def sweep(entries: list[tuple[str, str]], check: Callable[[str, str], tuple[bool, str]]) -> int:
    """Checks each (group, model name) entry with check, printing a line each and a summary;
    the exit status: 1 if any model failed or raised."""
    failed = []
    for group, name in entries:
        start = time.perf_counter()
        try:
            ok, what = check(group, name)
        except Exception as e:  # noqa: BLE001  (a model that raises is a failure)
            ok, what = False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        seconds = time.perf_counter() - start
        print(f"{'ok  ' if ok else 'FAIL'} {group:36s} {name:34s} {what} ({seconds:.1f} s)")
        sys.stdout.flush()
        if not ok:
            failed.append(name)
    print(f"{len(entries) - len(failed)} of {len(entries)} ok, {len(failed)} failed")
    if failed:
        print("failed: " + " ".join(failed))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    torch_accel._C._set_fallback_mode("silent")  # counted, then reported
    entries = [
        (kind, name)
        for kind, module in KINDS.items()
        for name in torchvision.models.list_models(module=module)
        if not argv or name in argv
    ]
    return sweep(entries, lambda kind, name: sweep_one(name, kind))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
