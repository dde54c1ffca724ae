"""Third-party models on accel against the same models on the CPU, measured in the same run.

What a user sees of the eager backend: one training step (forward, loss, backward, SGD step with
momentum) and one inference forward of models built by libraries this project did not write,
timed in alternation with the same model on the CPU (ratio: CPU time / accel time; goal at
least 0.9, since accel's host driver runs the CPU's kernels on its own memory and should cost
little over them):

* torchvision ResNet-18 and timm ConvNeXt-Atto and ViT-Tiny (batch 8, 64x64 images; ViT at
  img_size=64), in training mode (BatchNorm statistics updated);
* transformers GPT-2 and BERT at small sizes (2 layers, width 256, batch 8, 128 tokens; built
  from configs, never downloaded), with their own language-model loss;
* transformers' ``generate()`` with GPT-2 (4 layers, width 256, 2 prompts of 16 tokens, 48 new
  tokens, greedy, KV cache): decoding multiplies two rows by each weight, small work where a
  kernel's threads cost more than they save.

Random weights and inputs, the same on both sides (built from one seed). Each side runs in its
own process, and the two are timed in alternation: in one process the CPU's calls would pay for
accel's stream worker (libgomp throttles its threads' spinning once two OpenMP teams hold more
threads than there are cores, so every parallel region of the CPU's kernels wakes sleeping
threads: GPT-2's generate() took 222 ms on the CPU next to accel, 95 ms alone). Prints a table
and writes JSON (default benchmarks/results/models.json).

    python benchmarks/models.py [--json PATH]
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ratios import best_of, report
from torch import nn

import torch_accel  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 8
IMAGES = (8, 3, 64, 64)

# A case: make(device) returns the call to time on that device, its model and inputs built from
# seed 0 (so both sides' are the same).
Make = Callable[[str], Callable[[], None]]


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


def language(kind: str) -> Make:
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
        return training_step(model, inputs, lambda out, _: out.loss, None, device)

    return make


def generation(device: str) -> Callable[[], None]:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=1000, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config).eval().to(device)
    ids = torch.randint(0, 1000, (2, 16)).to(device)
    mask = torch.ones_like(ids)

    def run() -> None:
        with torch.inference_mode():
            model.generate(
                ids, attention_mask=mask, max_new_tokens=48, min_new_tokens=48,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip

    return run


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
    "convnext_atto_train": vision(timm_model("convnext_atto")),
    "vit_tiny_train": vision(timm_model("vit_tiny_patch16_224", img_size=64)),
    "vit_tiny_infer": inference(timm_model("vit_tiny_patch16_224", img_size=64)),
    "gpt2_small_train": language("gpt2"),
    "bert_small_train": language("bert"),
    "gpt2_generate": generation,
}
GOALS = dict.fromkeys(CASES, 0.9)


def serve(device: str) -> None:
    """A side's process: for each case name it reads, the case's first call (answered with
    null: first calls, an optimizer's state), then one timed call per later request (answered
    with its seconds)."""
    warnings.filterwarnings("ignore")
    calls: dict[str, Callable[[], None]] = {}
    for line in sys.stdin:
        name = line.strip()
        try:
            if name not in calls:
                calls[name] = CASES[name](device)
                best_of(calls[name], 1, device)
                answer: object = None
            else:
                answer = best_of(calls[name], 1, device)
        except Exception as e:  # noqa: BLE001 - the parent reports it, and the other cases run
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


class Side:
    """The process of one side, started once for all cases."""

    def __init__(self, device: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--side", device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def ask(self, name: str) -> float | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the side's process ended (exit status {self.proc.wait()})")
        answer = json.loads(line)
        if isinstance(answer, dict):
            raise RuntimeError(answer["error"])
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def measured(name: str, sides: dict[str, Side]) -> Callable[[], tuple[float, float]]:
    """(CPU seconds, accel seconds) of case ``name``: the best of ROUNDS calls on each side,
    timed in alternation, so that a machine whose speed drifts (shared cores) slows both alike."""

    def case() -> tuple[float, float]:
        for side in sides.values():
            side.ask(name)
        times: dict[str, list[float]] = {device: [] for device in sides}
        for _ in range(ROUNDS):
            for device, side in sides.items():
                times[device].append(side.ask(name))
        return min(times["cpu"]), min(times["accel"])

    return case


if __name__ == "__main__":
    if sys.argv[1:2] == ["--side"]:
        serve(sys.argv[2])
        raise SystemExit(0)
    warnings.filterwarnings("ignore")
    sides = {device: Side(device) for device in ("cpu", "accel")}
    try:
        status = report(
            __doc__.splitlines()[0],
            ROOT / "benchmarks/results/models.json",
            [(name, measured(name, sides)) for name in CASES],
            GOALS,
            ("cpu", "accel", "ratio"),
        )
    finally:
        for side in sides.values():
            side.close()
    raise SystemExit(status)
