"""Diffusers' models at toy sizes, with inputs: the "diffusion/<Class>" entries of the sweeps.

Diffusers has no auto mapping from a model type to tiny sizes, and its models' defaults are full
size (Flux's transformer alone is 12B parameters), so each entry here names its class, a small
configuration and the inputs its forward takes: the UNets of Stable Diffusion 1.x, SDXL, video
and audio, the VAEs and their video and audio variants, ControlNet and T2I-Adapter, and the
transformers of DiT, PixArt, SD3, Flux, Sana, AuraFlow, CogVideoX, LTX-Video, Wan, HunyuanDiT,
Lumina 2, Qwen-Image, Stable Audio, aMUSEd and the unCLIP prior. hf_tasks.build hands
"diffusion/..." entries here; hf_sweep and compile_sweep judge them as any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

B = 2  # batch
S = 16  # image side (pixels for VAEs, latents for denoisers)
T = 6  # text tokens


def _randn(*shape: int) -> Any:
    import torch

    return torch.randn(*shape, generator=_GEN[0])


_GEN: list[Any] = [None]


def _steps() -> Any:
    import torch

    return torch.tensor([10.0, 700.0])


def _ids(*shape: int, high: int) -> Any:
    import torch

    return torch.randint(0, high, shape, generator=_GEN[0])


def _positions(h: int, w: int, axes: int = 3) -> Any:
    """Flux-style position ids of an h x w grid of tokens: (h * w, axes), (0, row, column)."""
    import torch

    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    ids = torch.zeros(h * w, axes)
    ids[:, -2], ids[:, -1] = rows.flatten().float(), cols.flatten().float()
    return ids


_UNET = dict(
    block_out_channels=(8, 16),
    layers_per_block=1,
    norm_num_groups=4,
    sample_size=S,
)
_CROSS = dict(
    _UNET,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=16,
    attention_head_dim=4,
)
_VAE = dict(
    block_out_channels=(8, 16),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=S,
)
_FLUX = dict(
    in_channels=16,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=16,
    axes_dims_rope=(4, 6, 6),
)


def _unet_inputs(config: Any) -> dict[str, Any]:
    inputs = {"sample": _randn(B, config.in_channels, S, S), "timestep": _steps()}
    if getattr(config, "cross_attention_dim", None):
        inputs["encoder_hidden_states"] = _randn(B, T, config.cross_attention_dim)
    return inputs


def _sdxl_inputs(config: Any) -> dict[str, Any]:
    text = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
    added = {"text_embeds": _randn(B, text), "time_ids": _randn(B, 6)}
    return {**_unet_inputs(config), "added_cond_kwargs": added}


def _flux_inputs(config: Any) -> dict[str, Any]:
    side = 4
    inputs = {
        "hidden_states": _randn(B, side * side, config.in_channels),
        "encoder_hidden_states": _randn(B, T, config.joint_attention_dim),
        "timestep": _steps() / 1000,
        "img_ids": _positions(side, side, len(config.axes_dims_rope)),
        "txt_ids": _positions(1, T, len(config.axes_dims_rope)) * 0,
    }
    if getattr(config, "pooled_projection_dim", None):
        inputs["pooled_projections"] = _randn(B, config.pooled_projection_dim)
    if getattr(config, "guidance_embeds", False):
        inputs["guidance"] = _steps() / 100
    return inputs


def _latents_and_text(text_dim: int, pooled: int = 0, **fixed: Any) -> Callable[[Any], dict]:
    """Inputs of a text-conditioned image transformer: 4-channel 8x8 latents, T text tokens of
    `text_dim` features, timesteps, a pooled text vector of `pooled` if nonzero, and `fixed`."""

    def inputs(config: Any) -> dict[str, Any]:
        out = {
            "hidden_states": _randn(B, 4, 8, 8),
            "encoder_hidden_states": _randn(B, T, text_dim),
            "timestep": _steps(),
            **fixed,
        }
        if pooled:
            out["pooled_projections"] = _randn(B, pooled)
        return out

    return inputs


_HEADS = dict(num_attention_heads=2, attention_head_dim=8)


# name: (class, configuration, inputs from the built configuration)
ENTRIES: dict[str, tuple[str, dict[str, Any], Callable[[Any], dict[str, Any]]]] = {
    "UNet2DModel": (
        "UNet2DModel",
        dict(
            _UNET,
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=4,
        ),
        _unet_inputs,
    ),
    "UNet2DConditionModel": ("UNet2DConditionModel", dict(_CROSS, in_channels=4), _unet_inputs),
    "UNet2DConditionModel-sdxl": (
        "UNet2DConditionModel",
        dict(
            _CROSS,
            in_channels=4,
            transformer_layers_per_block=(1, 2),
            addition_embed_type="text_time",
            addition_time_embed_dim=4,
            projection_class_embeddings_input_dim=8 + 6 * 4,
            use_linear_projection=True,
        ),
        _sdxl_inputs,
    ),
    "UNet1DModel": (
        "UNet1DModel",
        dict(
            block_out_channels=(32, 32, 64),
            in_channels=2,
            out_channels=2,
            extra_in_channels=64,  # the Fourier time features: 2 x 32
            sample_size=64,
            use_timestep_embedding=False,
            flip_sin_to_cos=True,
            down_block_types=("DownBlock1DNoSkip", "DownBlock1D", "AttnDownBlock1D"),
            up_block_types=("AttnUpBlock1D", "UpBlock1D", "UpBlock1DNoSkip"),
            mid_block_type="UNetMidBlock1D",
            layers_per_block=1,
        ),
        lambda c: {"sample": _randn(B, 2, 64), "timestep": _steps()},
    ),
    "UNet3DConditionModel": (
        "UNet3DConditionModel",
        dict(
            _UNET,
            down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
            cross_attention_dim=16,
            attention_head_dim=4,
        ),
        lambda c: {
            "sample": _randn(B, 4, 3, S, S),
            "timestep": _steps(),
            "encoder_hidden_states": _randn(B, T, 16),
        },
    ),
    "UNetSpatioTemporalConditionModel": (
        "UNetSpatioTemporalConditionModel",
        dict(
            block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
            up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
            cross_attention_dim=16,
            num_attention_heads=(2, 4),
            layers_per_block=1,
            addition_time_embed_dim=4,
            projection_class_embeddings_input_dim=3 * 4,
            num_frames=3,
            sample_size=S,
        ),
        lambda c: {
            "sample": _randn(B, 3, 8, S, S),
            "timestep": _steps(),
            "encoder_hidden_states": _randn(B, 1, 16),
            "added_time_ids": _randn(B, 3),
        },
    ),
    "ControlNetModel": (
        "ControlNetModel",
        dict(
            {k: v for k, v in _CROSS.items() if k not in ("up_block_types", "sample_size")},
            conditioning_embedding_out_channels=(4, 8),
        ),
        lambda c: {**_unet_inputs(c), "controlnet_cond": _randn(B, 3, 2 * S, 2 * S)},
    ),
    "T2IAdapter": (
        "T2IAdapter",
        dict(in_channels=3, channels=(8, 16), num_res_blocks=1, downscale_factor=2),
        lambda c: {"x": _randn(B, 3, S, S)},
    ),
    "AutoencoderKL": ("AutoencoderKL", _VAE, lambda c: {"sample": _randn(B, 3, S, S)}),
    "AutoencoderTiny": (
        "AutoencoderTiny",
        dict(
            encoder_block_out_channels=(8, 8),
            decoder_block_out_channels=(8, 8),
            num_encoder_blocks=(1, 1),
            num_decoder_blocks=(1, 1),
            latent_channels=4,
        ),
        lambda c: {"sample": _randn(B, 3, S, S)},
    ),
    "VQModel": (
        "VQModel",
        dict(_VAE, num_vq_embeddings=32, vq_embed_dim=4),
        lambda c: {"sample": _randn(B, 3, S, S)},
    ),
    "AutoencoderDC": (
        "AutoencoderDC",
        dict(
            latent_channels=4,
            attention_head_dim=4,
            encoder_block_types=("ResBlock", "EfficientViTBlock"),
            decoder_block_types=("ResBlock", "EfficientViTBlock"),
            encoder_block_out_channels=(8, 16),
            decoder_block_out_channels=(8, 16),
            encoder_qkv_multiscales=((), (5,)),
            decoder_qkv_multiscales=((), (5,)),
            encoder_layers_per_block=(1, 1),
            decoder_layers_per_block=(1, 1),
            decoder_norm_types="rms_norm",
        ),
        lambda c: {"sample": _randn(B, 3, S, S)},
    ),
    "AutoencoderKLWan": (
        "AutoencoderKLWan",
        dict(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False]),
        lambda c: {"sample": _randn(B, 3, 5, S, S)},
    ),
    "AutoencoderOobleck": (
        "AutoencoderOobleck",
        dict(
            encoder_hidden_size=8,
            downsampling_ratios=[2, 4],
            channel_multiples=[1, 2],
            decoder_channels=8,
            decoder_input_channels=4,
            audio_channels=2,
        ),
        lambda c: {"sample": _randn(B, 2, 256)},
    ),
    "DiTTransformer2DModel": (
        "DiTTransformer2DModel",
        dict(num_attention_heads=2, attention_head_dim=8, num_layers=2, sample_size=8),
        lambda c: {
            "hidden_states": _randn(B, 4, 8, 8),
            "timestep": _steps(),
            "class_labels": _ids(B, high=10),
        },
    ),
    "PixArtTransformer2DModel": (
        "PixArtTransformer2DModel",
        dict(
            **_HEADS,
            num_layers=2,
            cross_attention_dim=16,
            caption_channels=12,
            sample_size=8,
        ),
        _latents_and_text(12, added_cond_kwargs={"resolution": None, "aspect_ratio": None}),
    ),
    "SD3Transformer2DModel": (
        "SD3Transformer2DModel",
        dict(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=16,
            caption_projection_dim=16,
            pooled_projection_dim=12,
            pos_embed_max_size=16,
            dual_attention_layers=(0,),
            qk_norm="rms_norm",
        ),
        _latents_and_text(16, pooled=12),
    ),
    "FluxTransformer2DModel": (
        "FluxTransformer2DModel",
        dict(_FLUX, pooled_projection_dim=12, guidance_embeds=True),
        _flux_inputs,
    ),
    "Flux2Transformer2DModel": (
        "Flux2Transformer2DModel",
        dict(_FLUX, axes_dims_rope=(4, 4, 4, 4), timestep_guidance_channels=16),
        _flux_inputs,
    ),
    "ChromaTransformer2DModel": (
        "ChromaTransformer2DModel",
        dict(_FLUX, approximator_num_channels=8, approximator_hidden_dim=16, approximator_layers=1),
        _flux_inputs,
    ),
    "SanaTransformer2DModel": (
        "SanaTransformer2DModel",
        dict(
            in_channels=4,
            out_channels=4,
            **_HEADS,
            num_layers=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=8,
            cross_attention_dim=16,
            caption_channels=12,
            sample_size=8,
        ),
        _latents_and_text(12),
    ),
    "AuraFlowTransformer2DModel": (
        "AuraFlowTransformer2DModel",
        dict(
            sample_size=8,
            num_mmdit_layers=1,
            num_single_dit_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            joint_attention_dim=12,
            caption_projection_dim=16,
            pos_embed_max_size=64,
        ),
        _latents_and_text(12),
    ),
    "CogVideoXTransformer3DModel": (
        "CogVideoXTransformer3DModel",
        dict(
            **_HEADS,
            in_channels=4,
            out_channels=4,
            time_embed_dim=8,
            text_embed_dim=12,
            num_layers=1,
            sample_width=8,
            sample_height=8,
            sample_frames=9,
            max_text_seq_length=T,
            use_rotary_positional_embeddings=False,
        ),
        lambda c: {
            "hidden_states": _randn(B, 3, 4, 8, 8),
            "encoder_hidden_states": _randn(B, T, 12),
            "timestep": _steps(),
        },
    ),
    "LTXVideoTransformer3DModel": (
        "LTXVideoTransformer3DModel",
        dict(
            in_channels=8,
            out_channels=8,
            **_HEADS,
            cross_attention_dim=16,
            num_layers=1,
            caption_channels=12,
        ),
        lambda c: {
            "hidden_states": _randn(B, 2 * 4 * 4, 8),
            "encoder_hidden_states": _randn(B, T, 12),
            "timestep": _steps(),
            "encoder_attention_mask": _ids(B, T, high=1) + 1,
            "num_frames": 2,
            "height": 4,
            "width": 4,
        },
    ),
    "WanTransformer3DModel": (
        "WanTransformer3DModel",
        dict(
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=16,
            ffn_dim=32,
            num_layers=2,
            rope_max_seq_len=32,
        ),
        lambda c: {
            "hidden_states": _randn(B, 4, 2, 8, 8),
            "timestep": _steps(),
            "encoder_hidden_states": _randn(B, T, 16),
        },
    ),
    "HunyuanDiT2DModel": (
        "HunyuanDiT2DModel",
        dict(
            **_HEADS,
            in_channels=4,
            patch_size=2,
            sample_size=8,
            hidden_size=16,
            num_layers=2,
            cross_attention_dim=16,
            cross_attention_dim_t5=16,  # pooled by an 8-head attention
            pooled_projection_dim=8,
            text_len=T,
            text_len_t5=T,
        ),
        lambda c: {
            "hidden_states": _randn(B, 4, 8, 8),
            "timestep": _steps(),
            "encoder_hidden_states": _randn(B, T, 16),
            "text_embedding_mask": _ids(B, T, high=1) + 1,
            "encoder_hidden_states_t5": _randn(B, T, 16),
            "text_embedding_mask_t5": _ids(B, T, high=1) + 1,
            "image_meta_size": _randn(B, 6),
            "style": _ids(B, high=1),
            "image_rotary_emb": _hunyuan_rope(),
        },
    ),
    "Lumina2Transformer2DModel": (
        "Lumina2Transformer2DModel",
        dict(
            sample_size=8,
            in_channels=4,
            hidden_size=16,
            num_layers=1,
            num_refiner_layers=1,
            num_attention_heads=2,
            num_kv_heads=1,
            multiple_of=8,
            axes_dim_rope=(4, 2, 2),
            axes_lens=(32, 32, 32),
            cap_feat_dim=12,
        ),
        lambda c: {
            "hidden_states": _randn(B, 4, 8, 8),
            "timestep": _steps() / 1000,
            "encoder_hidden_states": _randn(B, T, 12),
            "encoder_attention_mask": (_ids(B, T, high=1) + 1).bool(),
        },
    ),
    "QwenImageTransformer2DModel": (
        "QwenImageTransformer2DModel",
        dict(
            in_channels=16,
            out_channels=4,
            num_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=12,
            axes_dims_rope=(4, 6, 6),
        ),
        lambda c: {
            "hidden_states": _randn(B, 16, 16),
            "encoder_hidden_states": _randn(B, T, 12),
            "encoder_hidden_states_mask": _ids(B, T, high=1) + 1,
            "timestep": _steps() / 1000,
            "img_shapes": [[(1, 4, 4)]] * B,
        },
    ),
    "StableAudioDiTModel": (
        "StableAudioDiTModel",
        dict(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            num_key_value_attention_heads=1,
            cross_attention_dim=16,
            time_proj_dim=8,
            global_states_input_dim=12,
            cross_attention_input_dim=16,
        ),
        lambda c: {
            "hidden_states": _randn(B, 4, 16),
            "timestep": _steps(),
            "encoder_hidden_states": _randn(B, T, 16),
            "global_hidden_states": _randn(B, 1, 12),
        },
    ),
    "UVit2DModel": (
        "UVit2DModel",
        dict(
            hidden_size=16,
            cond_embed_dim=12,
            micro_cond_encode_dim=2,
            micro_cond_embed_dim=10,
            encoder_hidden_size=12,
            vocab_size=32,
            codebook_size=30,
            in_channels=16,
            block_out_channels=16,
            num_res_blocks=1,
            block_num_heads=2,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            sample_size=4,
        ),
        lambda c: {
            "input_ids": _ids(B, 4, 4, high=32),
            "encoder_hidden_states": _randn(B, T, 12),
            "pooled_text_emb": _randn(B, 12),
            "micro_conds": _randn(B, 5),
        },
    ),
    "PriorTransformer": (
        "PriorTransformer",
        dict(
            **_HEADS,
            num_layers=2,
            embedding_dim=16,
            num_embeddings=T,
            additional_embeddings=4,
        ),
        lambda c: {
            "hidden_states": _randn(B, 16),
            "timestep": _steps(),
            "proj_embedding": _randn(B, 16),
            "encoder_hidden_states": _randn(B, T, 16),
        },
    ),
}


def _hunyuan_rope() -> Any:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    return get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4))


def architectures() -> list[str]:
    """The "diffusion/<entry>" names, or none where diffusers is not installed."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return []
    return [f"diffusion/{name}" for name in ENTRIES]


def build(name: str, max_parameters: float) -> tuple[Any, Any, dict[str, Any]] | str:
    """(config, model, inputs) of entry `name`, or why it does not run on the CPU."""
    import diffusers
    import torch

    cls_name, kwargs, make_inputs = ENTRIES[name]
    cls = getattr(diffusers, cls_name)
    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in cls(**kwargs).parameters())
    except Exception as e:  # noqa: BLE001 (this diffusers release refuses our sizes)
        return "configuration: " + f"{type(e).__name__}: {e}".splitlines()[0][:140]
    if size > max_parameters:
        return f"{size / 1e6:.0f}M parameters"
    torch.manual_seed(0)
    model = cls(**kwargs)
    _GEN[0] = torch.Generator().manual_seed(1)
    try:
        inputs = make_inputs(model.config)
        with torch.no_grad():
            model.eval()(**inputs)
    except Exception as e:  # noqa: BLE001 (our sizes or inputs do not fit this model)
        return "on the CPU: " + f"{type(e).__name__}: {e}".splitlines()[0][:140]
    return model.config, model.train(), inputs
