"""timm's model families on accel: one forward and backward each against the CPU.

timm (PyTorch Image Models) carries layers torchvision does not: attention variants (halo,
lambda, window, relative-position, class attention), evolving and normalization-free
convolutions (scaled weight standardization), gather-excite, blur pooling, split attention,
selective kernels, token mixers (pooling, MLP, Mamba-style gated convolutions), re-parameterized
blocks. For each family of each timm module (the name up to its first digit or underscore:
resnet, seresnext, ecaresnet, ...) the smallest model, by parameter count on the meta device,
runs one training-mode forward and backward on accel, on the CPU in float32 and on the CPU in
float64 (the reference), and is judged as test/vision_sweep.py judges torchvision's models: no
CPU fallback, and accel's error against float64 at most ten times the float32 CPU's.

Random weights, never downloaded; dropout and drop path off; 10 classes; input 64x64 where the
model takes it (built with img_size=64 where it has the argument), else the model's own size.
Models over 150M parameters are left out (the host driver's default device holds 4 GiB).

    python test/timm_sweep.py [MODEL ...]      (make timm-sweep: every family, ~6 min)

The exit status is 1 if any model failed or raised.
"""

from __future__ import annotations

import re
import sys
import warnings
from typing import Any

import timm
import torch
from torch import nn
from vision_sweep import MAX_PARAMETERS, judge, sweep

import torch_accel

SMALL = 64


def families() -> dict[str, str]:
    """{module/family: the family's smallest model}, in timm's module order."""
    found: dict[str, tuple[str, int]] = {}
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            family = f"{module}/{re.match(r'[a-z]+', name).group(0)}"
            try:
                with torch.device("meta"):
                    count = sum(p.numel() for p in build(name, None).parameters())
            except Exception:  # noqa: BLE001  (a variant that cannot be built is not the pick)
                continue
            if family not in found or count < found[family][1]:
                found[family] = (name, count)
    return {family: name for family, (name, _) in found.items()}


def build(name: str, img_size: int | None) -> nn.Module:
    kwargs: dict[str, Any] = {"num_classes": 10, "drop_rate": 0.0, "drop_path_rate": 0.0}
    if img_size is not None:
        kwargs["img_size"] = img_size
    for drop in ([], ["img_size"], ["img_size", "drop_path_rate"]):
        try:
            return timm.create_model(name, **{k: v for k, v in kwargs.items() if k not in drop})
        except TypeError as e:  # an argument the model does not take
            error = e
    raise error


def model_and_input(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The model, in training mode, and a batch of two its size: 64x64 if it runs there."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = build(name, SMALL)
    try:
        with torch.no_grad():
            model.eval()(torch.randn(2, 3, SMALL, SMALL, generator=g))
        size = (3, SMALL, SMALL)
    except Exception:  # noqa: BLE001  (a fixed size: the model's own)
        torch.manual_seed(0)
        model = build(name, None)
        size = model.pretrained_cfg["input_size"]
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        if isinstance(getattr(m, "drop_prob", None), float):  # timm's DropPath, DropBlock
            m.drop_prob = 0.0
    return model.train(), torch.randn(2, *size, generator=g)


def sweep_one(name: str) -> tuple[bool, str]:
    model, x = model_and_input(name)
    if sum(p.numel() for p in model.parameters()) > MAX_PARAMETERS:
        return True, "left out (over 150M parameters)"
    ok, what = judge(model, [x])
    return ok, f"{tuple(x.shape[2:])}: {what}"


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    torch_accel._C._set_fallback_mode("silent")  # counted, then reported
    names = families() if not argv else {name: name for name in argv}
    return sweep(list(names.items()), lambda family, name: sweep_one(name))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
