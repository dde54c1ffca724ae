"""Every transformers architecture we can feed, on accel eagerly: a training step against the CPU.

Text: each model type with a causal LM, masked LM or sequence-to-sequence head (transformers'
auto mappings, about 250), built from a tiny configuration (compile_sweep.SMALL, never
downloaded). Vision, audio and image-text (entries "image/vit", "audio/wav2vec2",
"image-text/clip"): each model type with an image classification, segmentation, depth or
detection head, a CTC, audio classification or speech sequence-to-sequence head, or a
zero-shot image classification model (hf_tasks.py builds their configurations and inputs).
Diffusers (entries "diffusion/UNet2DConditionModel"): its UNets, VAEs and diffusion
transformers at toy sizes (diffusers_tasks.py).
One forward and backward runs on the CPU (the reference) and on accel with the CPU fallback
allowed and counted, every dropout off. An architecture passes when no operator took the
fallback, the loss is within 1e-5 (relative) of the CPU's and every gradient within 1e-3 of the
largest gradient element of the model (accel runs the CPU's kernels on the host driver: most
match bit for bit); where not, when accel's errors against a float64 CPU run are within 4x the
float32 CPU's own (the verdict says "against float64").

Skipped, and listed as such: architectures whose tiny configuration transformers refuses or whose
model fails on the CPU too (shapes the generic configuration gets wrong), text models with
sub-configurations (multimodal: their inputs are model-specific) and any over 30M parameters.

    python test/hf_sweep.py [MODEL_TYPE ...]     (make hf-sweep: all of them, ~20 min)

The models run in one worker process, restarted after a crash; the exit status is 1 if any
architecture failed or crashed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

import hf_tasks
from compile_sweep import SMALL

MAX_PARAMETERS = 30e6
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-3
NOISE = 4  # against float64: how much larger than the CPU's float32 error accel's may be


def architectures() -> list[str]:
    from transformers.models.auto import modeling_auto as auto

    heads = (
        auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )
    return sorted(set().union(*heads)) + hf_tasks.architectures()


def _measure(name: str) -> dict[str, Any]:
    """In the worker: accel's errors against the CPU, or why the architecture is skipped."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSeq2SeqLM,
    )

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    if "/" in name:  # a vision, audio or multimodal architecture (hf_tasks.py)
        built = hf_tasks.build(name, MAX_PARAMETERS)
        if isinstance(built, str):
            return {"skip": built[:160]}
        config, model, inputs = built
        return _compare(model, lambda device: hf_tasks.to(inputs, device))
    try:
        config = AutoConfig.for_model(name, **SMALL)
    except Exception as e:  # noqa: BLE001 (transformers refuses the tiny configuration)
        return {"skip": f"configuration: {e!r}"[:160]}
    if getattr(config, "sub_configs", None):
        return {"skip": f"multimodal ({', '.join(sorted(config.sub_configs))})"}
    model, error = None, None
    for head in (AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForMaskedLM, AutoModel):
        try:
            model = head.from_config(config)
            break
        except Exception as e:  # noqa: BLE001 (no such head, or the model refuses the config)
            error = e
    if model is None:
        return {"skip": f"model: {error!r}"[:160]}
    size = sum(p.numel() for p in model.parameters())
    if size > MAX_PARAMETERS:
        return {"skip": f"{size / 1e6:.0f}M parameters"}
    model.train()
    ids = torch.randint(3, 64, (2, 16), generator=torch.Generator().manual_seed(1))

    def inputs(device: str) -> dict[str, Any]:
        kwargs = {"input_ids": ids.to(device), "labels": ids.to(device)}
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids.to(device)
        return kwargs

    return _compare(model, inputs)


def _compare(model: Any, inputs: Any) -> dict[str, Any]:
    """One forward and backward of `model` on the CPU and on accel: accel's errors."""
    import torch

    import torch_accel

    hf_tasks.without_randomness(model)

    def run(device: str, dtype: Any = None) -> tuple[float, dict[str, torch.Tensor]]:
        kwargs = hf_tasks.to(inputs(device), device, dtype)
        m = copy.deepcopy(model).to(device, dtype)
        return hf_tasks.training_step(m, kwargs), hf_tasks.gradients(m)

    def errors(a: Any, b: Any) -> tuple[float, dict[str, float]]:
        """Loss error relative to b's loss, gradient errors relative to b's largest element."""
        scale = max((float(g.abs().max()) for g in b[1].values() if g.numel()), default=0.0)
        grads = {}
        for n, g in b[1].items():
            h = a[1].get(n)
            grads[n] = (
                float("inf")
                if h is None
                else float((g - h.to(g.dtype)).abs().max()) / (scale + 1e-12)
                if g.numel()
                else 0.0
            )
        return abs(a[0] - b[0]) / (abs(b[0]) + 1e-12), grads

    try:
        cpu = run("cpu")
    except Exception as e:  # noqa: BLE001 (the CPU fails: not accel's to test)
        return {"skip": f"on the CPU: {e!r}"[:160]}
    torch_accel._C._set_fallback_mode("silent")
    torch.accel.reset_fallback_stats()
    accel = run("accel")
    fallback = {str(k): v for k, v in torch.accel.fallback_stats().items()}
    loss_error, grads = errors(accel, cpu)
    off = {n: e for n, e in grads.items() if e > GRAD_TOLERANCE}
    result = {"loss_error": loss_error, "off": off, "fallback": fallback}
    if loss_error <= LOSS_TOLERANCE and not off:
        return result
    # Not the CPU's float32 result: within the CPU's own float32 error against float64? (Batch
    # norm over two values per channel, as at the end of a conv net fed 32x32 images, turns the
    # last bits of a convolution's order of summation into visible differences.)
    try:
        exact = run("cpu", torch.float64)
    except Exception:  # noqa: BLE001 (no float64 kernels: the float32 comparison stands)
        return result
    accel_loss, accel_grads = errors(accel, exact)
    cpu_loss, cpu_grads = errors(cpu, exact)
    return {
        "loss_error": accel_loss,
        "loss_allowed": max(LOSS_TOLERANCE, NOISE * cpu_loss),
        "off": {
            n: e for n, e in accel_grads.items() if e > max(GRAD_TOLERANCE, NOISE * cpu_grads[n])
        },
        "fallback": fallback,
        "against": "float64",
    }


def _verdict(result: dict[str, Any]) -> tuple[str, str]:
    if "skip" in result:
        return "skip", result["skip"]
    if "error" in result:
        return "FAIL", result["error"]
    bad = []
    if result["fallback"]:
        bad.append(f"CPU fallback: {result['fallback']}")
    if result["loss_error"] > result.get("loss_allowed", LOSS_TOLERANCE):
        bad.append(f"loss off by {result['loss_error']:.1e}")
    if result["off"]:
        worst = max(result["off"], key=result["off"].get)
        bad.append(f"{len(result['off'])} gradients off, worst {worst} {result['off'][worst]:.2g}")
    against = f" against {result['against']}" if "against" in result else ""
    if bad:
        return "FAIL", "; ".join(bad) + against
    return "ok", f"loss off by {result['loss_error']:.1e}{against}"


def _worker(names: list[str]) -> None:
    for name in names:
        print(f"START {name}", flush=True)
        try:
            result = _measure(name)
        except Exception as e:  # noqa: BLE001 (accel raised where the CPU did not)
            result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
        print(f"RESULT {name} {json.dumps(result)}", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        _worker(argv[1:])
        return 0
    known = architectures()
    names = argv or known
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"unknown model types {unknown}")
        return 2
    counts = {"ok": 0, "skip": 0, "FAIL": 0}
    left = list(names)
    while left:
        command = [sys.executable, __file__, "--worker", *left]
        errors = tempfile.TemporaryFile("w+")  # (a pipe the worker fills would block it)
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        assert proc.stdout is not None
        current, start = None, time.perf_counter()
        for line in proc.stdout:
            if line.startswith("START "):
                current, start = line.split()[1], time.perf_counter()
            elif line.startswith("RESULT "):
                _, name, payload = line.split(" ", 2)
                verdict, detail = _verdict(json.loads(payload))
                took = time.perf_counter() - start
                print(f"{verdict:4} {name:28} {took:4.0f} s  {detail}", flush=True)
                counts[verdict] += 1
                left.remove(name)
                current = None
        proc.wait()
        errors.seek(0)
        stderr = errors.read()
        errors.close()
        if current is None:
            break
        tail = " / ".join(stderr.strip().splitlines()[-2:])[-300:]
        print(f"FAIL {current:28} crashed ({proc.returncode}): {tail}", flush=True)
        counts["FAIL"] += 1
        left.remove(current)
    print(f"{counts['ok']} passed, {counts['FAIL']} failed, {counts['skip']} skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
