"""Third-party models on accel against the same models on the CPU, measured in the same run.

What a user sees of the eager backend: one training step (forward, loss, backward, SGD step with
momentum) and one inference forward of models built by libraries this project did not write,
timed in alternation with the same model on the CPU (ratio: CPU time / accel time; goal at
least 0.9, since accel's host driver runs the CPU's kernels on its own memory and should cost
little over them):

* torchvision ResNet-18 and timm ConvNeXt-Atto and ViT-Tiny (batch 8, 64x64 images; ViT at
  img_size=64), in training mode (BatchNorm statistics updated); ResNet-18 also with images of
  a size new at every step (every convolution's call is the first of its shapes);
* transformers GPT-2 and BERT at small sizes (2 layers, width 256, batch 8, 128 tokens; built
  from configs, never downloaded), with their own language-model loss; GPT-2 also with a
  sequence length new at every step (dynamic padding: every call is the first of its shapes);
* transformers' ``generate()`` with GPT-2 (4 layers, width 256, 2 prompts of 16 tokens, 48 new
  tokens, greedy, KV cache): decoding multiplies two rows by each weight, small work where a
  kernel's threads cost more than they save.

Random weights and inputs, the same on both sides (built from one seed). Each side runs in its
own process, and the two are timed in alternation: in one process the CPU's calls would pay for
accel's stream worker (libgomp throttles its threads' spinning once two OpenMP teams hold more
threads than there are cores, so every parallel region of the CPU's kernels wakes sleeping
threads: GPT-2's generate() took 222 ms on the CPU next to accel, 95 ms alone). Prints a table
and writes JSON (default benchmarks/results/models.json).

    python benchmarks/models.py [--json PATH] [CASE ...]
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ratios import Make, Side, against_cpu, report, serve
from torch import nn

import torch_accel  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 8
IMAGES = (8, 3, 64, 64)

# A case (ratios.Make) builds its model and inputs from seed 0, so both sides' are the same.


def training_step(
    model: nn.Module, inputs: dict[str, Any], loss_of: Callable, target: Any, device: str
) -> Callable[[], None]:
    """One training step of ``model`` on ``device`` (SGD with momentum)."""
    m = model.to(device).train()
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


def vision(build: Callable[[], nn.Module]) -> Make:
    def make(device: str) -> Callable[[], None]:
        torch.manual_seed(0)
        model = build()
        x = torch.randn(*IMAGES)
        y = torch.randint(0, 10, (IMAGES[0],))
        return training_step(model, {"x": x}, nn.functional.cross_entropy, y, device)

    return make


def vision_new_sizes(build: Callable[[], nn.Module]) -> Make:
    """A training step on images of a size no earlier step used (64, 63, ... 41, then 64 again:
    a detector's or a segmenter's inputs of varying sizes), so that every convolution's and
    batch norm's first call of a signature is in the timing."""

    def make(device: str) -> Callable[[], None]:
        torch.manual_seed(0)
        model = build().to(device).train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        x = torch.randn(*IMAGES).to(device)
        y = torch.randint(0, 10, (IMAGES[0],)).to(device)
        size = [IMAGES[-1]]

        def step() -> None:
            size[0] = size[0] - 1 if size[0] > 41 else IMAGES[-1]
            batch = x[:, :, : size[0], : size[0]].contiguous()
            loss = nn.functional.cross_entropy(model(batch), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    return make


def inference(build: Callable[[], nn.Module]) -> Make:
    def make(device: str) -> Callable[[], None]:
        torch.manual_seed(0)
        model = build().eval().to(device)
        x = torch.randn(*IMAGES).to(device)

        def run() -> None:
            with torch.inference_mode():
                model(x)

        return run

    return make


def language(kind: str, new_lengths: bool = False) -> Make:
    """A training step of a small transformers model on 8 sequences of 128 tokens, or with
    ``new_lengths`` of a length no earlier step used (127, 126, ...: batches padded to their
    longest sequence, so that every operator's first call of a signature is in the timing)."""

    def make(device: str) -> Callable[[], None]:
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
        inputs = {"input_ids": ids, "labels": ids}
        if not new_lengths:
            return training_step(model, inputs, lambda out, _: out.loss, None, device)
        on_device = ids.to(device)
        length = [ids.shape[1]]
        model.to(device).train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

        def step() -> None:
            length[0] = length[0] - 1 if length[0] > 16 else ids.shape[1]
            batch = on_device[:, : length[0]]
            loss = model(input_ids=batch, labels=batch).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    return make


def generation(new_lengths: bool = False) -> Make:
    """GPT-2's greedy ``generate()`` of 48 tokens after a prompt of 16, or with ``new_lengths``
    after a prompt 49 tokens longer than the last call's (every decoding step's shapes are new
    to the process, as in a server whose prompts vary: first calls of signatures are timed)."""

    def make(device: str) -> Callable[[], None]:
        import transformers

        torch.manual_seed(0)
        config = transformers.GPT2Config(
            n_layer=4, n_embd=256, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0
        )
        model = transformers.GPT2LMHeadModel(config).eval().to(device)
        ids = torch.randint(0, 1000, (2, 16 + 49 * 16)).to(device)
        calls = [0]

        def run() -> None:
            length = 16 + 49 * (calls[0] % 17 if new_lengths else 0)
            calls[0] += 1
            prompt = ids[:, :length].contiguous()
            with torch.inference_mode():
                model.generate(
                    prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=48,
                    min_new_tokens=48, do_sample=False, pad_token_id=0,
                )  # fmt: skip

        return run

    return make


def resnet18() -> nn.Module:
    import torchvision

    return torchvision.models.resnet18(num_classes=10)


def timm_model(name: str, **kwargs: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm

        return timm.create_model(name, num_classes=10, drop_path_rate=0.0, **kwargs)

    return build


CASES: dict[str, Make] = {
    "resnet18_train": vision(resnet18),
    "resnet18_infer": inference(resnet18),
    "resnet18_train_new_sizes": vision_new_sizes(resnet18),
    "convnext_atto_train": vision(timm_model("convnext_atto")),
    "vit_tiny_train": vision(timm_model("vit_tiny_patch16_224", img_size=64)),
    "vit_tiny_infer": inference(timm_model("vit_tiny_patch16_224", img_size=64)),
    "gpt2_small_train": language("gpt2"),
    "bert_small_train": language("bert"),
    "gpt2_small_train_new_lengths": language("gpt2", new_lengths=True),
    "gpt2_generate": generation(),
    "gpt2_generate_new_lengths": generation(new_lengths=True),
}
GOALS = dict.fromkeys(CASES, 0.9)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        serve(CASES, sys.argv[2])
        raise SystemExit(0)
    warnings.filterwarnings("ignore")
    sides = {device: Side(__file__, device) for device in ("cpu", "accel")}
    try:
        status = report(
            __doc__.splitlines()[0],
            ROOT / "benchmarks/results/models.json",
            [(name, against_cpu([name], sides, ROUNDS)) for name in CASES],
            GOALS,
            ("cpu", "accel", "ratio"),
        )
    finally:
        for side in sides.values():
            side.close()
    raise SystemExit(status)
