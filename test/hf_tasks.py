"""transformers' vision, audio and multimodal architectures for the sweeps: models and inputs.

Each task names the auto mappings whose model types it covers and builds, for one model type,
the model and its inputs: the first of several configurations (a tiny one with the usual size
keys, the same without its list-valued keys, the default) that transformers accepts, that stays
under the parameter limit and whose forward runs on the CPU. Vision and audio configurations
have no common set of size keys, so the tiny one is a guess that fits many; the default catches
the rest where it is small enough.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import diffusers_tasks
from compile_sweep import SMALL

_NO_DROPOUT = {k: v for k, v in SMALL.items() if isinstance(v, float) and v == 0.0}
_COMMON = dict(
    _NO_DROPOUT,
    pad_token_id=0,  # as in the text sweep
    drop_path_rate=0.0,
    layerdrop=0.0,
    encoder_layerdrop=0.0,
    decoder_layerdrop=0.0,
    speech_encoder_layerdrop=0.0,
    mask_time_prob=0.0,
    mask_feature_prob=0.0,
    num_labels=3,
)
# The text sweep's sizes of a transformer body and of an encoder-decoder's parts and tokens.
_BODY = {
    k: SMALL[k]
    for k in "hidden_size num_hidden_layers num_attention_heads intermediate_size".split()
}
_SEQ2SEQ = {
    k: SMALL[k]
    for k in (
        "d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads"
        " encoder_ffn_dim decoder_ffn_dim vocab_size pad_token_id bos_token_id eos_token_id"
        " decoder_start_token_id"
    ).split()
}
VISION_SMALL: dict[str, Any] = dict(
    _COMMON,
    **_BODY,
    image_size=64,
    patch_size=4,
    num_channels=3,
    embedding_size=16,
    embed_dim=16,
    window_size=4,
    hidden_sizes=[16, 32],
    depths=[1, 1],
    num_heads=[2, 4],
)
AUDIO_SMALL: dict[str, Any] = dict(
    _COMMON,
    **_BODY,
    **_SEQ2SEQ,
    conv_dim=[16, 16, 16],
    conv_stride=[5, 2, 2],
    conv_kernel=[10, 3, 3],
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
    max_source_positions=64,
    max_target_positions=64,
    num_mel_bins=16,
    max_length=64,
)


def _without_lists(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if not isinstance(v, list)}


def _image_inputs(config: Any, model: Any) -> list[dict[str, Any]]:
    import torch

    size = getattr(config, "image_size", 224)
    size = size if isinstance(size, int) else size[0]
    channels = getattr(config, "num_channels", 3)
    g = torch.Generator().manual_seed(1)
    return [{"pixel_values": torch.randn(2, channels, size, size, generator=g)}]


def _audio_inputs(config: Any, model: Any) -> list[dict[str, Any]]:
    """Candidate inputs: models read waveforms, spectrograms or feature frames of many shapes."""
    import torch

    g = torch.Generator().manual_seed(1)
    name = getattr(model, "main_input_name", "input_values")
    shapes = []
    if name != "input_features" and hasattr(config, "max_length"):  # AST: (frames, mel bins)
        shapes.append((2, config.max_length, getattr(config, "num_mel_bins", 128)))
    elif name != "input_features":  # a raw waveform
        shapes.append((2, 4000))
    else:  # log-mel or filter-bank frames
        if hasattr(config, "max_source_positions") and hasattr(config, "num_mel_bins"):
            shapes.append((2, config.num_mel_bins, 2 * config.max_source_positions))  # whisper
        where = [config, getattr(config, "encoder_config", None)]
        for key in ("feature_projection_input_dim", "input_feat_per_channel", "num_mel_bins"):
            for c in where:
                if isinstance(getattr(c, key, None), int):
                    shapes.append((2, 64, getattr(c, key) * getattr(c, "input_channels", 1)))
    candidates = []
    for shape in shapes:
        inputs: dict[str, Any] = {name: torch.randn(*shape, generator=g)}
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(3, 60, (2, 8), generator=g)
        candidates.append(inputs)
    return candidates


def _image_text_inputs(config: Any, model: Any) -> list[dict[str, Any]]:
    import torch

    vision = getattr(config, "vision_config", config)
    (inputs,) = _image_inputs(vision, model)
    vocab = getattr(getattr(config, "text_config", config), "vocab_size", 64)
    g = torch.Generator().manual_seed(2)
    inputs["input_ids"] = torch.randint(3, min(vocab, 64), (2, 8), generator=g)
    return [inputs]


IMAGE_TOKEN = 5  # within the tiny vocabulary; text tokens are drawn above it
VISION_START, VISION_END = 4, 3  # Qwen-VL's markers around an image's tokens


def _count_image_features(features: Any, batch: int) -> int:
    """Feature vectors per image from what a model's get_image_features returned."""
    import torch

    if not isinstance(features, torch.Tensor | list | tuple):  # a ModelOutput
        pooled = getattr(features, "pooler_output", None)
        features = features[0] if pooled is None else pooled
    if isinstance(features, list | tuple):  # one tensor per image
        return sum(f.reshape(-1, f.shape[-1]).shape[0] for f in features) // batch
    return features.reshape(-1, features.shape[-1]).shape[0] // batch


def _vision_language_inputs(config: Any, model: Any) -> list[dict[str, Any]]:
    """Text with as many image tokens as the vision tower yields features, and the images.

    The image token moves into the tiny vocabulary; the model's get_image_features says how
    many tokens each image takes (patches, pooled or merged as this model does).
    """

    import torch

    tokens = {
        "image_token_id": IMAGE_TOKEN,
        "image_token_index": IMAGE_TOKEN,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
    }
    for key, value in tokens.items():
        for c in (config, getattr(config, "text_config", None)):
            current = getattr(c, key, False)  # (BLIP-2's is None until a checkpoint sets it)
            if current is None or (isinstance(current, int) and not isinstance(current, bool)):
                setattr(c, key, value)
    vision = getattr(config, "vision_config", config)
    (images,) = _image_inputs(vision, model)
    pixels = images["pixel_values"]
    size = pixels.shape[-1]
    candidates = [images]
    parameters = inspect.signature(model.forward).parameters
    if "image_sizes" in parameters:  # llava-next, pixtral
        sizes = torch.tensor([[size, size]] * 2)
        candidates.append({**images, "image_sizes": sizes})
        if hasattr(config, "image_grid_pinpoints"):  # LLaVA-NeXT: the image and one tile of it
            config.image_grid_pinpoints = [[size, size]]
            tiles = torch.stack([pixels, pixels.flip(-1)], 1)
            candidates.append({"pixel_values": tiles, "image_sizes": sizes})
    candidates.append({"pixel_values": pixels[:, None]})  # Idefics3, SmolVLM: images per sample
    if "image_grid_thw" in parameters:  # Qwen-VL: flattened patches of a 1 x 4 x 4 grid
        patch = getattr(vision, "in_channels", 3) * getattr(vision, "temporal_patch_size", 1)
        patch *= getattr(vision, "patch_size", 14) ** 2
        g = torch.Generator().manual_seed(1)
        flat = torch.randn(2 * 16, patch, generator=g)
        grid = torch.tensor([[1, 4, 4]] * 2)
        candidates.insert(0, {"pixel_values": flat, "image_grid_thw": grid})
    g = torch.Generator().manual_seed(2)
    text = torch.randint(IMAGE_TOKEN + 1, 64, (2, 8), generator=g)
    for inputs in candidates:
        try:
            with torch.no_grad():
                features = getattr(model, "model", model).get_image_features(**inputs)
        except Exception:  # noqa: BLE001,S112 (the model wants the other inputs)
            continue
        count = _count_image_features(features, 2)
        images = torch.full((2, count), IMAGE_TOKEN)
        marker = torch.full((2, 1), VISION_START)
        ids = torch.cat([torch.ones(2, 1, dtype=torch.long), marker, images, text], 1)
        inputs = {**inputs, "input_ids": ids, "labels": ids}
        if "mm_token_type_ids" in parameters:  # Qwen-VL: 1 marks the image's tokens
            inputs["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
        return [inputs]
    return []


# task: (auto mapping names, candidate configurations, inputs)
TASKS: dict[str, tuple[tuple[str, ...], list[dict[str, Any]], Callable[..., list[Any]]]] = {
    "image": (
        (
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES",
            "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES",
            "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES",
        ),
        [VISION_SMALL, _without_lists(VISION_SMALL), _COMMON],
        _image_inputs,
    ),
    "image-text": (
        ("MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES",),
        [VISION_SMALL, _without_lists(VISION_SMALL), _COMMON],
        _image_text_inputs,
    ),
    "vision-language": (
        ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",),
        [VISION_SMALL, _without_lists(VISION_SMALL)],
        _vision_language_inputs,
    ),
    "audio": (
        (
            "MODEL_FOR_CTC_MAPPING_NAMES",
            "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
            "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
        ),
        [AUDIO_SMALL, _without_lists(AUDIO_SMALL), _COMMON],
        _audio_inputs,
    ),
}


def _mapping(task: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto as auto

    merged: dict[str, str] = {}
    for name in TASKS[task][0]:
        for model_type, cls in getattr(auto, name, {}).items():
            merged.setdefault(model_type, cls if isinstance(cls, str) else cls[0])
    return merged


def architectures() -> list[str]:
    """Entries "task/model_type" of every model type with a head of one of the TASKS, then
    diffusers' models ("diffusion/<entry>", diffusers_tasks.py)."""
    entries = sorted(f"{task}/{model_type}" for task in TASKS for model_type in _mapping(task))
    return entries + diffusers_tasks.architectures()


def _config(model_type: str, kwargs: dict[str, Any]) -> Any:
    """The configuration of `model_type` with `kwargs`, its sub-configurations made alike.

    A text sub-configuration (CLIP's text tower) takes the text sweep's tiny sizes, any other
    (a vision tower, a detector's backbone) `kwargs`; one that refuses them keeps its default.
    """
    from transformers import AutoConfig, PretrainedConfig

    default = AutoConfig.for_model(model_type)
    subs = {}
    for key in getattr(default, "sub_configs", None) or {}:
        sub = getattr(default, key, None)
        if not isinstance(sub, PretrainedConfig) or not kwargs:
            continue
        if isinstance(getattr(sub, "backbone", None), str):  # a timm model by name (DETR's)
            subs[key] = copy.deepcopy(sub)
            subs[key].backbone = "resnet18"
            continue
        small = SMALL if "text" in key else kwargs
        for candidate in (small, _without_lists(small)):
            try:
                subs[key] = type(sub)(**candidate)
                if hasattr(subs[key], "out_hidden_size"):  # Qwen-VL: merged patches -> text
                    subs[key].out_hidden_size = SMALL["hidden_size"]
                break
            except Exception:  # noqa: BLE001,S112 (this sub-configuration wants other sizes)
                continue
    config = AutoConfig.for_model(model_type, **kwargs, **subs)
    # PaliGemma's projector maps image features to the vision configuration's projection_dim,
    # which must be the text's width.
    text, vision = getattr(config, "text_config", None), getattr(config, "vision_config", None)
    if hasattr(config, "image_token_id") and text is not None:
        for c in (config, vision):
            if hasattr(c, "projection_dim"):
                c.projection_dim = text.hidden_size
    # VipLLaVA concatenates five layers' features, as deep as 11 layers down: the tiny tower's two.
    if isinstance(getattr(config, "vision_feature_layer", None), list | tuple):
        config.vision_feature_layer = [-2, -1]
    # Qwen2.5-VL's window attention counts windows in merged patches: a window smaller than one
    # (VISION_SMALL's Swin-sized 4) leaves none.
    if getattr(vision, "spatial_merge_size", None) and getattr(vision, "window_size", None):
        unit = vision.patch_size * vision.spatial_merge_size
        vision.window_size = max(vision.window_size, 2 * unit)
    # Qwen-VL's multimodal rotary embedding splits head_dim / 2 into three sections.
    modeling = type(default).__module__.replace(".configuration_", ".modeling_")
    try:
        uses_mrope = "mrope_section" in inspect.getsource(importlib.import_module(modeling))
    except (ImportError, OSError):
        uses_mrope = False
    if uses_mrope:
        text = getattr(config, "text_config", config)
        half = (getattr(text, "head_dim", None) or SMALL["head_dim"]) // 2
        rope = dict(getattr(text, "rope_parameters", None) or {})
        rope["mrope_section"] = [half - 2 * (half // 4), half // 4, half // 4]
        text.rope_parameters = rope
    return config


def build(entry: str, max_parameters: float) -> tuple[Any, Any, dict[str, Any]] | str:
    """(config, model, inputs) for "task/model_type", or why none of its configurations runs."""
    import torch
    import transformers

    task, model_type = entry.split("/", 1)
    if task == "diffusion":
        return diffusers_tasks.build(model_type, max_parameters)
    _, candidates, make_inputs = TASKS[task]
    head = getattr(transformers, _mapping(task)[model_type], None)
    if head is None:
        return f"transformers has no {_mapping(task)[model_type]}"
    reasons = []
    for kwargs in candidates:
        try:
            config = _config(model_type, kwargs)
            with torch.device("meta"):  # sized before any memory is spent (some are 3B)
                size = sum(p.numel() for p in head(config).parameters())
            if size > max_parameters:
                reasons.append(f"{size / 1e6:.0f}M parameters")
                continue
            torch.manual_seed(0)
            model = head(config)
            tries = make_inputs(config, model)
            if not tries:
                reasons.append("no inputs of ours fit the model")
            for inputs in tries:
                try:
                    with torch.no_grad():
                        model.eval()(**inputs)
                    return config, model.train(), inputs
                except Exception as e:  # noqa: BLE001 (inputs of another shape, or no fit)
                    reasons.append(f"{type(e).__name__}: {e}".splitlines()[0][:100])
        except Exception as e:  # noqa: BLE001 (this configuration does not fit the model)
            reasons.append(f"{type(e).__name__}: {e}".splitlines()[0][:100])
    return "no configuration runs on the CPU: " + " / ".join(reasons)


def without_randomness(model: Any) -> Any:
    """Every dropout of `model` off, whatever configuration key sets it (mobilenet's
    classifier_dropout_prob is 0.999, in place): the devices draw different random numbers."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name in ("drop_prob", "dropout_prob"):  # layer drop; diffusers' class-label drop
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model


def training_step(model: Any, kwargs: dict[str, Any]) -> float:
    """One forward and backward of `model` (a copy the caller owns); returns the loss: the
    model's own where it computes one from `labels` (dropped for a model that takes none), else
    the mean square of its first output, in at least float32."""
    import torch

    try:
        out = model(**kwargs)
    except TypeError:  # no labels: a base model
        kwargs = {k: v for k, v in kwargs.items() if k != "labels"}
        out = model(**kwargs)

    def mean_square(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.promote_types(t.dtype, torch.float32)).square().mean()

    if isinstance(out, torch.Tensor):  # aMUSEd's logits
        loss = mean_square(out)
    elif isinstance(out, (tuple, list)):  # T2I-Adapter's features: every tensor counts
        loss = sum(mean_square(t) for t in out if isinstance(t, torch.Tensor))
    else:  # a ModelOutput
        loss = getattr(out, "loss", None)
        if loss is None:
            loss = mean_square(next(v for v in out.values() if isinstance(v, torch.Tensor)))
    loss.backward()
    return float(loss)


def to(inputs: Any, device: str, dtype: Any = None) -> Any:
    """`inputs` with every tensor in it on `device`, the floating ones in `dtype` if given
    (diffusers' models take nested dicts and lists)."""
    import torch

    if isinstance(inputs, dict):
        return {k: to(v, device, dtype) for k, v in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(to(v, device, dtype) for v in inputs)
    if not isinstance(inputs, torch.Tensor):
        return inputs
    return inputs.to(device, dtype if dtype and inputs.is_floating_point() else None)


def gradients(model: Any) -> dict[str, Any]:
    """The gradients training_step left in `model`, on the CPU, by parameter name."""
    return {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
