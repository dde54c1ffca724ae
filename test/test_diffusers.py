"""Diffusers on accel: its models trained, its pipelines sampled, against the CPU.

Diffusers' models and pipelines are code we did not write that exercises what transformers does
not: group norm over convolutions, up- and down-sampling, 3-d (video) convolutions, timestep and
rotary embeddings, joint text-image attention, and the schedulers' arithmetic on small tensors in
a loop. Everything is built from toy configurations (test/diffusers_tasks.py; nothing is
downloaded) with random weights, and no operator may take the CPU fallback.

- Models: one forward and backward of each kind, judged by hf_sweep's verdict (make hf-sweep runs
  every "diffusion/..." entry).
- Training: the loop of diffusers' unconditional-training example (noise added at random
  timesteps by the scheduler, the noise predicted, AdamW), losses and weights against the CPU's.
- Pipelines: Stable Diffusion with a dozen schedulers, SD3 and Flux with flow matching, fed
  prompt embeddings (no text encoders), images against the CPU's for the same CPU generator.
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Callable
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

diffusers = pytest.importorskip("diffusers")
import diffusers_tasks  # noqa: E402
import hf_sweep  # noqa: E402

ACCEL = torch.device("accel")

# numpy 2's deprecations of torch.Tensor.__array__ (CPU tensors too) and diffusers' of old
# scheduler configurations: thousands of lines that say nothing about accel
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


ONCE = pytest.mark.default_only  # the debug modes run the others of the kind (for time)


@pytest.mark.parametrize(
    "entry",
    [
        "UNet2DConditionModel-sdxl",  # cross attention, added text and time embeddings
        pytest.param("UNet3DConditionModel", marks=ONCE),  # video: 3-d convolutions
        "AutoencoderKL",  # the VAE of Stable Diffusion
        "FluxTransformer2DModel",  # joint attention, 3-axis rotary embedding, guidance
        pytest.param("WanTransformer3DModel", marks=ONCE),  # video, RMS-normed queries and keys
        pytest.param("DiTTransformer2DModel", marks=ONCE),  # adaLN-zero, class labels
    ],
)
def test_diffusers_models_train_like_cpu(entry: str) -> None:
    verdict, detail = hf_sweep._verdict(hf_sweep._measure(f"diffusion/{entry}"))
    assert verdict == "ok", f"{entry}: {detail}"


def test_unconditional_training_loop_like_cpu(no_fallback: None) -> None:
    """diffusers' train_unconditional example, three steps: timesteps drawn per sample, the
    scheduler's add_noise on the device, the UNet predicting the noise, AdamW."""
    cls, kwargs, _ = diffusers_tasks.ENTRIES["UNet2DModel"]
    torch.manual_seed(0)
    unet = getattr(diffusers, cls)(**kwargs)
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=1000)
    data = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(2, 3, 16, 16, generator=data),
            torch.randn(2, 3, 16, 16, generator=data),
            torch.randint(0, 1000, (2,), generator=data),
        )
        for _ in range(3)
    ]
    runs = {}
    for device in ("cpu", ACCEL):
        model = copy.deepcopy(unet).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
        losses = []
        for images, noise, steps in batches:
            images, noise, steps = images.to(device), noise.to(device), steps.to(device)
            noisy = scheduler.add_noise(images, noise, steps)
            loss = torch.nn.functional.mse_loss(model(noisy, steps).sample, noise)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        runs[str(device)] = (
            torch.stack(losses),
            {n: p.detach().cpu() for n, p in model.named_parameters()},
        )
    cpu, acc = runs["cpu"], runs["accel"]
    torch.testing.assert_close(acc[0], cpu[0], rtol=1e-5, atol=1e-6)
    for n, p in cpu[1].items():
        torch.testing.assert_close(
            acc[1][n], p, rtol=1.3e-6, atol=3e-5, msg=lambda m, n=n: f"{n}: {m}"
        )


def _pipeline(cls: str, **components: Any) -> Any:
    """Pipeline `cls` with `components` and None for every other required one (text encoders,
    tokenizers: the prompts come as embeddings)."""
    pipeline = getattr(diffusers, cls)
    params = inspect.signature(pipeline.__init__).parameters
    required = {k: None for k, p in params.items() if k != "self" and p.default is p.empty}
    pipe = pipeline(**{**required, **components})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sample(pipe: Any, device: Any, embeddings: dict[str, torch.Tensor], **kwargs: Any) -> Any:
    pipe = pipe.to(device)
    # a fresh scheduler per run: they keep state between calls (PNDM's fails on a second call)
    pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    return pipe(
        **{k: v.to(device) for k, v in embeddings.items()},
        num_inference_steps=4,  # PNDM takes no fewer
        height=32,
        width=32,
        generator=torch.Generator().manual_seed(0),  # diffusers draws on the CPU, then moves
        output_type="pt",
        **kwargs,
    ).images.cpu()


def _assert_samples_like_cpu(
    got: torch.Tensor, expected: torch.Tensor, resample_on_cpu: Callable[[], torch.Tensor]
) -> None:
    """Images within 1e-5 of the CPU's, or within the CPU's own difference between its default
    threads and one (plus 1e-5): accel runs small operators on one thread where the CPU splits
    some, and how much that moves a sample depends on the machine's kernels (on an AVX2 EPYC,
    Stable Diffusion with DDIM: 1.4e-5 between the CPU on one thread and on two, accel equal to
    the first)."""
    assert expected.std() > 0.05  # an image, not a constant
    if (got - expected).abs().max() <= 1e-5:
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one_thread = resample_on_cpu()
    finally:
        torch.set_num_threads(threads)
    noise = (one_thread - expected).abs().max().item()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 + noise)


def _vae() -> Any:
    return diffusers.AutoencoderKL(**dict(diffusers_tasks._VAE, shift_factor=0.1))


SCHEDULERS = [
    "DDIMScheduler",
    "DDPMScheduler",
    "PNDMScheduler",
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",  # fresh noise every step
    "HeunDiscreteScheduler",
    "KDPM2AncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "DEISMultistepScheduler",
    "UniPCMultistepScheduler",
    "LCMScheduler",
    "TCDScheduler",
]


@pytest.mark.parametrize(
    "scheduler",
    [
        s
        if s in ("DDIMScheduler", "EulerAncestralDiscreteScheduler")
        else pytest.param(s, marks=ONCE)
        for s in SCHEDULERS
    ],
)
def test_stable_diffusion_pipeline_samples_like_cpu(scheduler: str, no_fallback: None) -> None:
    torch.manual_seed(0)
    cls, kwargs, _ = diffusers_tasks.ENTRIES["UNet2DConditionModel"]
    pipe = _pipeline(
        "StableDiffusionPipeline",
        unet=getattr(diffusers, cls)(**kwargs),
        vae=_vae(),
        scheduler=getattr(diffusers, scheduler)(),
        requires_safety_checker=False,
    )
    embeddings = {
        "prompt_embeds": torch.randn(1, 6, 16),
        "negative_prompt_embeds": torch.randn(1, 6, 16),
    }
    expected = _sample(pipe, "cpu", embeddings, guidance_scale=5.0)
    got = _sample(pipe, ACCEL, embeddings, guidance_scale=5.0)
    _assert_samples_like_cpu(
        got, expected, lambda: _sample(pipe, "cpu", embeddings, guidance_scale=5.0)
    )


@pytest.mark.parametrize(
    ("pipeline", "entry", "negative"),
    [
        ("FluxPipeline", "FluxTransformer2DModel", False),
        ("StableDiffusion3Pipeline", "SD3Transformer2DModel", True),
    ],
)
def test_flow_matching_pipelines_sample_like_cpu(
    pipeline: str, entry: str, negative: bool, no_fallback: None
) -> None:
    torch.manual_seed(0)
    cls, kwargs, _ = diffusers_tasks.ENTRIES[entry]
    pipe = _pipeline(
        pipeline,
        transformer=getattr(diffusers, cls)(**kwargs),
        vae=_vae(),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
    )
    embeddings = {
        "prompt_embeds": torch.randn(1, 6, 16),
        "pooled_prompt_embeds": torch.randn(1, 12),
    }
    if negative:  # SD3's classifier-free guidance
        embeddings["negative_prompt_embeds"] = torch.randn(1, 6, 16)
        embeddings["negative_pooled_prompt_embeds"] = torch.randn(1, 12)
    expected = _sample(pipe, "cpu", embeddings)
    got = _sample(pipe, ACCEL, embeddings)
    _assert_samples_like_cpu(got, expected, lambda: _sample(pipe, "cpu", embeddings))
