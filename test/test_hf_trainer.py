"""Hugging Face's Trainer and Accelerate train on accel, against the CPU.

Accelerate picks its device from a fixed list (cuda, xpu, mps, npu, ...) and otherwise from
``ACCELERATE_TORCH_DEVICE``; with ``ACCELERATE_TORCH_DEVICE=accel`` the Trainer puts the model
and every batch on accel (pinned by its DataLoader) and trains there. Its ``bf16=True`` flag
refuses every device transformers does not list (``is_torch_bf16_gpu_available``), and
Accelerate's fp16 likewise; ``Accelerator(mixed_precision="bf16")`` runs under accel's autocast.

Accelerate keeps its device in a process-wide singleton, so each run is a fresh interpreter.
"""

from __future__ import annotations

import json

import pytest
import torch

# A tiny Llama and `samples` sequences of `seq` random tokens (labels = inputs), in a script.
LLAMA = r"""
import json, os, sys, tempfile
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
config = transformers.LlamaConfig(
    vocab_size={vocab}, hidden_size={hidden}, num_hidden_layers={layers}, num_attention_heads=4,
    num_key_value_heads=2, intermediate_size={intermediate}, max_position_embeddings={positions},
)
model = transformers.LlamaForCausalLM(config)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": torch.randint(1, {vocab}, ({seq},), generator=g)} for _ in range({samples})]
for d in data:
    d["labels"] = d["input_ids"].clone()
"""


def _llama(**sizes: int) -> str:
    """LLAMA with its {vocab}, {hidden}, ... filled in (str.format would trip on the dicts)."""
    script = LLAMA
    for name, value in sizes.items():
        script = script.replace("{" + name + "}", str(value))
    return script


TRAIN = (
    _llama(vocab=64, hidden=32, intermediate=64, layers=2, positions=64, seq=16, samples=16)
    + r"""
args = transformers.TrainingArguments(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, num_train_epochs=1,
    learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no", seed=0,
    dataloader_pin_memory=True, use_cpu=sys.argv[1] == "cpu",
)
trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
trainer.train()
accel = sys.argv[1] == "accel"
print(json.dumps({
    "device": str(next(model.parameters()).device),
    "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    "weight": model.lm_head.weight.detach().cpu().flatten()[:16].tolist(),
    "fallbacks": torch.accel.fallback_stats() if accel else {},
}))
"""
)

ACCELERATE_BF16 = r"""
import json
import torch
from accelerate import Accelerator
accelerator = Accelerator(mixed_precision="bf16")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
seen = []
model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
x, y = torch.randn(8, 8), torch.randn(8, 1)
model, opt = accelerator.prepare(model, opt)
loss = torch.nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device))
accelerator.backward(loss)
opt.step()
print(json.dumps({
    "device": str(accelerator.device),
    "inner": str(seen[0]),
    "loss": loss.dtype == torch.float32 and loss.item(),
}))
"""


AUTO_FIND_BATCH_SIZE = (
    _llama(vocab=4096, hidden=64, intermediate=128, layers=1, positions=64, seq=64, samples=256)
    + r"""
sizes = []
class Seen(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):
        sizes.append(trainer._train_batch_size)
args = transformers.TrainingArguments(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=128, auto_find_batch_size=True,
    max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[], save_strategy="no", seed=0,
)
trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Seen()])
trainer.train()
print(json.dumps({"device": str(next(model.parameters()).device), "sizes": sizes,
                  "ooms": torch.accel.memory_stats()["num_ooms"]}))
"""
)


def _run(run_python, code: str, *args: str, **env: str) -> dict:
    result = run_python(f"import sys; sys.argv = ['-', *{list(args)!r}]\n" + code, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_trainer_trains_on_accel_like_on_the_cpu(run_python) -> None:
    cpu = _run(run_python, TRAIN, "cpu")
    env = {"ACCELERATE_TORCH_DEVICE": "accel", "ACCEL_FALLBACK": "error"}
    accel = _run(run_python, TRAIN, "accel", **env)
    assert cpu["device"] == "cpu" and accel["device"] == "accel:0"
    assert len(accel["losses"]) == len(cpu["losses"]) == 4
    assert accel["losses"] == pytest.approx(cpu["losses"], rel=1e-5)
    assert accel["weight"] == pytest.approx(cpu["weight"], rel=1e-4, abs=1e-5)
    assert accel["fallbacks"] == {}


def test_accelerate_bf16_runs_under_accels_autocast(run_python) -> None:
    out = _run(run_python, ACCELERATE_BF16, ACCELERATE_TORCH_DEVICE="accel")
    assert out["device"] == "accel"
    assert out["inner"] == "torch.bfloat16"  # the Linear ran in bfloat16 under autocast
    assert out["loss"] > 0  # outputs converted back to float32 by Accelerate


def test_accelerate_finds_a_batch_size_that_fits_after_out_of_memory() -> None:
    # find_executable_batch_size (and transformers' auto_find_batch_size, built on it) shrinks
    # the batch when the error reads "<device> out of memory.", as CUDA's and XPU's do.
    from accelerate.utils import find_executable_batch_size
    from accelerate.utils.memory import should_reduce_batch_size

    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(8 << 30, dtype=torch.uint8, device="accel:1")
    assert should_reduce_batch_size(caught.value)
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=2048)
    def step(batch_size: int) -> float:
        tried.append(batch_size)
        rows = torch.ones(batch_size, 1 << 20, device="accel:1")  # 4 MiB a row
        return float(rows[-1, -1])

    assert step() == 1.0
    assert tried[0] == 2048 and len(tried) > 1 and tried[-1] * (1 << 22) <= 4 << 30
    assert all(b == int(a * 0.9) for a, b in zip(tried, tried[1:], strict=False))


def test_trainer_auto_find_batch_size_shrinks_the_batch_on_accel(run_python) -> None:
    # A 256 MiB device: batch 128 does not fit; the Trainer retries smaller batches (x0.9) until
    # one trains, as it does on CUDA, since accel's error reads "accel out of memory.".
    out = _run(
        run_python, AUTO_FIND_BATCH_SIZE, ACCELERATE_TORCH_DEVICE="accel", ACCEL_HOST_MEMORY="256M"
    )
    sizes = out["sizes"]
    assert out["device"] == "accel:0" and out["ooms"] >= 1
    assert sizes[0] == 128 and sizes[-1] == sizes[-2] < 128  # the last size ran both steps
    assert all(b == int(a * 0.9) for a, b in zip(sizes[:-2], sizes[1:-1], strict=True))
