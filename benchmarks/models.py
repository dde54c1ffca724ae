"""Third-party models on accel against the same models on the CPU, measured in the same run.

What a user sees of the eager backend: one training step (forward, loss, backward, SGD step with
momentum) and one inference forward of models built by libraries this project did not write,
timed in alternation with the same model on the CPU (ratio: CPU time / accel time; goal at
least 0.9, since accel's host driver runs the CPU's kernels on its own memory and should cost
little over them):

* torchvision ResNet-18 and timm ConvNeXt-Atto and ViT-Tiny (batch 8, 64x64 images; ViT at
  img_size=64), in training mode (BatchNorm statistics updated);
* transformers GPT-2 and BERT at small sizes (2 layers, width 256, batch 8, 128 tokens; built
  from configs, never downloaded), with their own language-model loss.

Random weights and inputs; each case copies the model to both devices first. Prints a table and
writes JSON (default benchmarks/results/models.json).

    python benchmarks/models.py [--json PATH]
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ratios import interleaved, report
from torch import nn

import torch_accel  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 8
IMAGES = (8, 3, 64, 64)


def vision(build: Callable[[], nn.Module]) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        torch.manual_seed(0)
        model = build()
        x = torch.randn(*IMAGES)
        y = torch.randint(0, 10, (IMAGES[0],))
        return both(model, {"x": x}, nn.functional.cross_entropy, y)

    return case


def language(kind: str) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        import transformers

        torch.manual_seed(0)
        size = dict(vocab_size=8192, n_positions=256, max_position_embeddings=256)
        size.update(bos_token_id=0, eos_token_id=0, pad_token_id=0)
        if kind == "gpt2":
            config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, **size)
            model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig(
                num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                intermediate_size=1024, **size,
            )  # fmt: skip
            model = transformers.BertForMaskedLM(config)
        for m in model.modules():  # deterministic: dropout off
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        ids = torch.randint(0, 8192, (8, 128))
        return both(model, {"input_ids": ids, "labels": ids}, lambda out, _: out.loss, None)

    return case


def alternate(make: Callable[[str], Callable[[], None]]) -> tuple[float, float]:
    """(CPU seconds, accel seconds) of the call make(device) returns for each device, called
    once first (first calls, an optimizer's state), then the best of ROUNDS in alternation."""
    calls = {device: make(device) for device in ("cpu", "accel")}
    for call in calls.values():
        call()
    return interleaved(calls["cpu"], calls["accel"], ROUNDS, device="accel")


def both(model: nn.Module, inputs: dict[str, Any], loss_of: Callable, target: Any) -> tuple:
    """(CPU seconds, accel seconds) of one training step, the best of ROUNDS in alternation."""

    def make(device: str) -> Callable[[], None]:
        m = copy.deepcopy(model).to(device).train()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        kw = {k: v.to(device) for k, v in inputs.items()}
        t = target.to(device) if target is not None else None

        def step() -> None:
            out = m(**kw)
            loss = loss_of(out, t)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    return alternate(make)


def inference(build: Callable[[], nn.Module]) -> Callable[[], tuple[float, float]]:
    def case() -> tuple[float, float]:
        torch.manual_seed(0)
        model = build().eval()
        x = torch.randn(*IMAGES)

        def make(device: str) -> Callable[[], None]:
            m, xd = copy.deepcopy(model).to(device), x.to(device)

            def run() -> None:
                with torch.inference_mode():
                    m(xd)

            return run

        return alternate(make)

    return case


def resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def timm_model(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, num_classes=10, drop_path_rate=0.0, **kwargs)

    return build


CASES = [
    ("resnet18_train", vision(resnet18)),
    ("resnet18_infer", inference(resnet18)),
    ("convnext_atto_train", vision(timm_model("convnext_atto"))),
    ("vit_tiny_train", vision(timm_model("vit_tiny_patch16_224", img_size=64))),
    ("vit_tiny_infer", inference(timm_model("vit_tiny_patch16_224", img_size=64))),
    ("gpt2_small_train", language("gpt2")),
    ("bert_small_train", language("bert")),
]
GOALS = {name: 0.9 for name, _ in CASES}

if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    raise SystemExit(
        report(
            __doc__.splitlines()[0],
            ROOT / "benchmarks/results/models.json",
            CASES,
            GOALS,
            ("cpu", "accel", "ratio"),
        )
    )
