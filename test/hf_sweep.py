"""Every transformers text architecture on accel, eagerly: one training step against the CPU.

For each model type with a causal LM, masked LM or sequence-to-sequence head (transformers'
auto mappings, about 250), a tiny configuration (compile_sweep.SMALL, never downloaded) builds
the model; one forward and backward runs on the CPU (the reference) and on accel with the CPU
fallback allowed and counted. An architecture passes when no operator took the fallback, the loss
is within 1e-5 (relative) of the CPU's and every gradient within 1e-3 of the largest gradient
element of the model (accel runs the CPU's kernels on the host driver: most match bit for bit).

Skipped, and listed as such: architectures whose tiny configuration transformers refuses or whose
model fails on the CPU too (shapes the generic configuration gets wrong), multimodal ones (their
sub-configurations keep full size) and any over 30M parameters.

    python test/hf_sweep.py [MODEL_TYPE ...]     (make hf-sweep: all of them, ~15 min)

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

from compile_sweep import SMALL

MAX_PARAMETERS = 30e6
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-3


def architectures() -> list[str]:
    from transformers.models.auto import modeling_auto as auto

    heads = (
        auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )
    return sorted(set().union(*heads))


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

    import torch_accel

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
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

    def run(device: str) -> tuple[float, dict[str, torch.Tensor]]:
        m = copy.deepcopy(model).to(device)
        kwargs = {"input_ids": ids.to(device)}
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids.to(device)
        try:
            out = m(**kwargs, labels=ids.to(device))
        except TypeError:  # no labels: a base model
            out = m(**kwargs)
        loss = (
            out.loss if getattr(out, "loss", None) is not None else out[0].float().square().mean()
        )
        loss.backward()
        return float(loss), {n: p.grad.cpu() for n, p in m.named_parameters() if p.grad is not None}

    try:
        ref_loss, ref = run("cpu")
    except Exception as e:  # noqa: BLE001 (the CPU fails: not accel's to test)
        return {"skip": f"on the CPU: {e!r}"[:160]}
    torch_accel._C._set_fallback_mode("silent")
    torch.accel.reset_fallback_stats()
    loss, grads = run("accel")
    scale = max((float(g.abs().max()) for g in ref.values() if g.numel()), default=0.0) + 1e-12
    off = {}
    for n, g in ref.items():
        h = grads.get(n)
        err = float("inf") if h is None else float((g - h).abs().max()) / scale if g.numel() else 0
        if err > GRAD_TOLERANCE:
            off[n] = err
    return {
        "loss_error": abs(loss - ref_loss) / (abs(ref_loss) + 1e-12),
        "off": off,
        "fallback": {str(k): v for k, v in torch.accel.fallback_stats().items()},
    }


def _verdict(result: dict[str, Any]) -> tuple[str, str]:
    if "skip" in result:
        return "skip", result["skip"]
    if "error" in result:
        return "FAIL", result["error"]
    bad = []
    if result["fallback"]:
        bad.append(f"CPU fallback: {result['fallback']}")
    if result["loss_error"] > LOSS_TOLERANCE:
        bad.append(f"loss off by {result['loss_error']:.1e}")
    if result["off"]:
        worst = max(result["off"], key=result["off"].get)
        bad.append(f"{len(result['off'])} gradients off, worst {worst} {result['off'][worst]:.2g}")
    return ("FAIL", "; ".join(bad)) if bad else ("ok", f"loss off by {result['loss_error']:.1e}")


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
