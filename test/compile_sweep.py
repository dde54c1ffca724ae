"""torch.compile over tiny transformers models: one training step on accel against the CPU.

For each architecture (a tiny configuration built from transformers' AutoConfig, never
downloaded), one forward and backward runs eagerly on the CPU (the reference), compiled with
Inductor on the CPU, and compiled on accel. An architecture passes when accel's loss and every
gradient match the reference as closely as the compiled CPU's do: a gradient more than 1e-3
(relative to its largest element, or to 1e-4 of the model's largest if that is more) off the
reference counts against accel only where the compiled CPU's is not off too (gradients whose
true value is about zero, such as attention key biases, differ on both), and the loss may not be
more than ten times (or 1e-5) further off than the CPU's. Where accel's eager results differ
from the CPU's in the last bits (DETR), compiled accel may instead meet the same bar against
eager accel; the verdict names the reference it met. Architectures that Inductor cannot compile
on the CPU either are skipped, saying so.

    python test/compile_sweep.py [ARCH ...]      (make compile-sweep: all of them, ~1 min each;
                                                  any other model type with SMALL alone, and
                                                  hf_sweep's vision, audio, image-text and
                                                  diffusers entries such as image/vit,
                                                  audio/whisper or diffusion/AutoencoderKL,
                                                  and timm's models: timm/resnet18)

Each architecture runs in its own process; the exit status is 1 if any failed or crashed.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from typing import Any

SMALL: dict[str, Any] = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    head_dim=8,
    embedding_size=32,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
    # Dropout and router noise off: the reference and the compiled runs draw different random
    # numbers.
    **{
        k: 0.0
        for k in (
            "hidden_dropout_prob attention_probs_dropout_prob attention_dropout dropout"
            " resid_pdrop embd_pdrop attn_pdrop summary_first_dropout activation_dropout"
            " classifier_dropout hidden_dropout mlp_dropout embedding_dropout residual_dropout"
            " router_jitter_noise input_jitter_noise"
        ).split()
    },
)
# Architectures (transformers model types) and what their tiny configuration adds to SMALL.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    **{
        name: {}
        for name in (
            "llama qwen2_moe mixtral olmoe granitemoe gpt_oss llama4_text bert roberta"
            " distilbert albert electra mpnet modernbert bart mbart xglm gpt2 starcoder2 olmo2"
            " nemotron glm smollm3 lfm2"
        ).split()
    },
    "mamba": dict(state_size=8, expand=2, conv_kernel=4, time_step_rank=4, use_mambapy=False),
    "mamba2": dict(
        state_size=8, expand=2, conv_kernel=4, n_groups=1, num_heads=4, head_dim=16, chunk_size=4
    ),
    "jamba": dict(
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        use_mamba_kernels=False,
    ),
}
GRAD_TOLERANCE = 1e-3


def _measure(name: str) -> dict[str, Any]:
    """In the worker: the compiled CPU's and accel's errors against the eager CPU."""
    import hf_tasks
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    import torch_accel  # noqa: F401

    torch.manual_seed(0)
    if name.startswith("timm/"):  # a timm model, as timm_sweep builds it (64x64 where it can)
        import timm_sweep

        model, x = timm_sweep.model_and_input(name[len("timm/") :])
        inputs = {"x": x}
    elif "/" in name:  # a vision, audio or image-text architecture: hf_tasks builds it
        built = hf_tasks.build(name, 30e6)
        if isinstance(built, str):
            return {"skip": built}
        config, model, inputs = built
        hf_tasks.without_randomness(model)
    else:
        config = AutoConfig.for_model(name, **{**SMALL, **ARCHITECTURES.get(name, {})})
        for auto in (AutoModelForCausalLM, AutoModelForMaskedLM, AutoModel):
            try:
                model = auto.from_config(config)
                break
            except ValueError:  # no such head for this architecture
                continue
        ids = torch.randint(3, 64, (2, 16), generator=torch.Generator().manual_seed(1))
        inputs = {"input_ids": ids, "labels": ids}
        if config.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids
    model.train()

    def run(device: str, compiled: bool) -> tuple[float, dict[str, torch.Tensor]]:
        m = copy.deepcopy(model).to(device)
        torch._dynamo.reset()
        f = torch.compile(m) if compiled else m
        loss = hf_tasks.training_step(f, hf_tasks.to(inputs, device))
        return loss, hf_tasks.gradients(m)  # (the compiled module's names have a prefix)

    def errors(reference: tuple[float, dict], got: tuple[float, dict]) -> dict[str, Any]:
        (ref_loss, ref_grads), (loss, grads) = reference, got
        # Relative to each gradient's largest element, but not below 1e-4 of the model's: a
        # gradient that is exactly zero (a softmax over one key) may come out as 1e-15.
        largest = (float(g.abs().max()) for g in ref_grads.values() if g.numel())
        floor = 1e-4 * max(largest, default=0.0)
        off = {}
        for n, g in ref_grads.items():
            h = grads.get(n)
            scale = max(float(g.abs().max()) if g.numel() else 0.0, floor) + 1e-12
            err = float("inf") if h is None else float((g - h).abs().max()) / scale
            if err > GRAD_TOLERANCE:
                off[n] = err
        return {"loss_error": abs(loss - ref_loss) / (abs(ref_loss) + 1e-12), "off": off}

    eager_cpu = run("cpu", False)
    try:
        compiled_cpu = run("cpu", True)
    except Exception as e:  # noqa: BLE001 (Inductor fails on the CPU too: not accel's to test)
        message = str(e).split("error:")[-1].strip().splitlines()[0][:120]
        return {"skip": f"compiled on the CPU: {type(e).__name__}: {message}"}
    compiled_accel = run("accel", True)
    return {
        "cpu": errors(eager_cpu, compiled_cpu),
        "accel": errors(eager_cpu, compiled_accel),
        # where eager accel differs from eager CPU in the last bits (DETR), compiled accel is
        # judged against eager accel
        "accel_eager": errors(run("accel", False), compiled_accel),
    }


def _verdict(result: dict[str, Any]) -> tuple[bool, str]:
    if "skip" in result:
        return True, f"skipped: {result['skip'][:160]}"
    cpu = result["cpu"]
    verdicts = []
    for key, against in (("accel", "eager CPU"), ("accel_eager", "eager accel")):
        accel = result[key]
        only_accel = sorted(set(accel["off"]) - set(cpu["off"]))
        loss_ok = accel["loss_error"] <= max(1e-5, 10 * cpu["loss_error"])
        detail = f"against {against}: loss {accel['loss_error']:.1e} (cpu {cpu['loss_error']:.1e})"
        detail += f", gradients off {len(accel['off'])} (cpu {len(cpu['off'])})"
        if only_accel:
            worst = max(only_accel, key=lambda n: accel["off"][n])
            detail += f"; off on accel only: {len(only_accel)}, worst {worst}"
            detail += f" {accel['off'][worst]:.2g}"
        if loss_ok and not only_accel:
            return True, detail
        verdicts.append(detail)
    return False, " / ".join(verdicts)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"]:
        print("RESULT " + json.dumps(_measure(argv[1])))
        return 0
    names = argv or list(ARCHITECTURES)
    import hf_tasks  # vision, audio and image-text architectures: "image/vit"
    from transformers import CONFIG_MAPPING  # any model type, with SMALL alone if not listed

    unknown = [n for n in names if n not in CONFIG_MAPPING and "/" not in n]
    unknown += [
        n
        for n in names
        if "/" in n and n not in hf_tasks.architectures() and not n.startswith("timm/")
    ]
    if unknown:
        print(f"unknown model types {unknown}; the sweep's own: {' '.join(ARCHITECTURES)}")
        return 2
    failed = []
    for name in names:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--one", name], capture_output=True, text=True, timeout=900
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            err = proc.stderr.strip().splitlines()
            errors = [ln for ln in err if "Error" in ln or "error:" in ln]  # not compile warnings
            ok, detail = False, "crashed: " + " / ".join((errors or err)[-3:])[-400:]
        else:
            ok, detail = _verdict(json.loads(lines[-1][len("RESULT ") :]))
        took = time.perf_counter() - start
        print(f"{'ok  ' if ok else 'FAIL'} {name:14} {took:5.0f} s  {detail}", flush=True)
        if not ok:
            failed.append(name)
    print(f"{len(names) - len(failed)} of {len(names)} architectures pass or skip")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
