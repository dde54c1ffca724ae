"""Third-party models on accel: Hugging Face transformers and torchvision, trained against the CPU.

Every model is built from a config with random weights (nothing is downloaded: the Hub is put
offline before transformers is imported), on the CPU with a fixed seed; a deep copy moves to accel.
Both copies train a few AdamW steps on the same batches, and the losses, the parameters and the
buffers after training must match the CPU's; the language models then decode greedily and must
pick the same tokens. No operator may take the copying CPU fallback: the fallback mode is `error`
and `torch.accel.fallback_stats()` must stay empty.

The models are tiny so that the file runs in seconds, but they take the code paths of the real
ones: rotary embeddings, grouped-query attention and SDPA with a KV cache and a left-padded prompt
(Llama), tied input and output embeddings (GPT-2), a padded encoder with a classification head
(BERT), top-k expert routing (Mixtral: its `grouped_mm` experts and its load-balancing loss call
`torch.histc` on int32 input on every device but the CPU and MPS, then `torch._grouped_mm`), and
batch normalization in training and in evaluation mode (ResNet-18, MobileNetV3-small). T5, ViT,
Whisper and Faster R-CNN (its nms and roi_align are torchvision's own operators, with CPU
kernels only) compare one forward and backward pass; torchvision's operators and a torch.library
operator with a CPU implementation also run alone.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any, TypeVar

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import transformers  # noqa: E402
from torch import nn  # noqa: E402

transformers.logging.set_verbosity_error()

ACCEL = torch.device("accel")
STEPS = 3

# AdamW's first step moves every parameter by about lr * sign(gradient), whatever the size of the
# gradient above eps: a gradient that is only rounding noise (GPT-2's attention key bias, whose
# exact gradient is zero because softmax ignores a shift shared by all keys) would move by a full
# lr in a direction chosen by the last bit of a sum. eps=1e-6 keeps such gradients (far below it)
# from moving their parameters, and lr=1e-3 keeps three steps close to the starting point; neither
# hides a wrong gradient, which is orders of magnitude above eps.
LR = 1e-3
EPS = 1e-6

# torch.testing's float32 rtol, and 3x its atol: the host driver runs the CPU's own kernels, but
# a call whose tensors all have fewer than 32768 elements runs on one thread on accel, where the
# CPU splits some of them over its threads; sums then round differently in the last bit, and
# three AdamW steps carry that into the parameters (MobileNetV3 in training mode: 1.03e-5 on one
# of 6000 weights). The CPU against itself with one thread and with two differs as much.
RTOL = 1.3e-6
ATOL = 3e-5

Batch = dict[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
M = TypeVar("M", bound=nn.Module)


def _to(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device) for k, v in batch.items()}


def _hf_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(**batch).loss


def _vision_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["pixels"]), batch["labels"])


def _lm_batches(vocab: int, batch: int = 2, seq: int = 8) -> list[Batch]:
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, vocab, (batch, seq))
        out.append({"input_ids": ids, "labels": ids})
    return out


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.device.type == "accel", what
    torch.testing.assert_close(
        actual.detach().cpu(), expected.detach(), rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}"
    )


def _step(
    model: nn.Module, opt: torch.optim.Optimizer, loss_fn: LossFn, batch: Batch
) -> torch.Tensor:
    device = next(model.parameters()).device
    opt.zero_grad()
    loss = loss_fn(model, _to(batch, device))
    loss.backward()
    opt.step()
    return loss.detach()


def _train_both(cpu: M, loss_fn: LossFn, batches: list[Batch], train: bool = True) -> M:
    """Trains the CPU model and an accel copy from the same weights, comparing the losses, then
    the parameters and buffers; returns the accel copy."""
    acc = copy.deepcopy(cpu).to(ACCEL)
    cpu.train(train)
    acc.train(train)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=LR, eps=EPS)
    opt_acc = torch.optim.AdamW(acc.parameters(), lr=LR, eps=EPS)
    for step, batch in enumerate(batches):
        expected = _step(cpu, opt_cpu, loss_fn, batch)
        _assert_close(_step(acc, opt_acc, loss_fn, batch), expected, f"loss at step {step}")
    expected_params = dict(cpu.named_parameters())
    for name, param in acc.named_parameters():
        _assert_close(param, expected_params[name], f"parameter {name}")
    expected_buffers = dict(cpu.named_buffers())
    for name, buf in acc.named_buffers():
        _assert_close(buf, expected_buffers[name], f"buffer {name}")
    return acc


def _assert_same_greedy_tokens(
    cpu: transformers.PreTrainedModel, acc: transformers.PreTrainedModel, vocab: int
) -> None:
    cpu.eval()
    acc.eval()
    prompt = torch.randint(1, vocab, (2, 5))
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # the second prompt is left-padded
    # output_router_logits=False: with router logits, Mixtral's generate fails on the CPU too
    # (transformers 5.23 computes the load-balancing loss with the prompt's attention mask against
    # one decoded token's router logits); the models that have no router ignore it.
    kwargs = {
        "max_new_tokens": 4,
        "do_sample": False,
        "pad_token_id": 0,
        "output_router_logits": False,
    }
    expected = cpu.generate(input_ids=prompt, attention_mask=mask, **kwargs)
    actual = acc.generate(input_ids=prompt.to(ACCEL), attention_mask=mask.to(ACCEL), **kwargs)
    assert actual.device.type == "accel"
    assert actual.cpu().tolist() == expected.tolist()


# The sizes that Llama and Mixtral share: grouped-query attention, 2 key-value heads for 4.
_GQA_DECODER: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "attention_dropout": 0.0,
    "pad_token_id": 0,
}


def _llama() -> tuple[transformers.PreTrainedModel, int]:
    config = transformers.LlamaConfig(**_GQA_DECODER, intermediate_size=64)
    return transformers.LlamaForCausalLM(config), config.vocab_size


def _gpt2() -> tuple[transformers.PreTrainedModel, int]:
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config), config.vocab_size


def _mixtral() -> tuple[transformers.PreTrainedModel, int]:
    config = transformers.MixtralConfig(
        **_GQA_DECODER,
        intermediate_size=48,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,  # adds the load-balancing loss (torch.histc) to the loss
        router_aux_loss_coef=0.1,
    )
    return transformers.MixtralForCausalLM(config), config.vocab_size


LMS: dict[str, Callable[[], tuple[transformers.PreTrainedModel, int]]] = {
    "llama": _llama,
    "gpt2": _gpt2,
    "mixtral": _mixtral,
}


@pytest.mark.parametrize("name", list(LMS))
def test_causal_lm_trains_and_decodes_like_cpu(name: str, no_fallback: None) -> None:
    torch.manual_seed(0)
    model, vocab = LMS[name]()
    acc = _train_both(model, _hf_loss, _lm_batches(vocab))
    _assert_same_greedy_tokens(model, acc, vocab)


def _t5() -> transformers.PreTrainedModel:
    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


@pytest.mark.parametrize(
    ("build", "cache"),
    [(lambda: _llama()[0], "static"), (_t5, "dynamic"), (_t5, "static")],
    ids=["llama-static", "t5-dynamic", "t5-static"],
)
def test_generate_with_static_caches_and_encoder_decoders_like_cpu(
    build: Any, cache: str, no_fallback: None
) -> None:
    # A static cache writes each step's keys and values into preallocated tensors at the step's
    # positions (index_copy_ / cache_position), an encoder-decoder model decodes over the
    # encoder's output: 16 greedy tokens of a left-padded batch, as on the CPU.
    torch.manual_seed(0)
    cpu = build().eval()
    acc = copy.deepcopy(cpu).to(ACCEL)
    prompt = torch.randint(3, 64, (2, 8))
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    kwargs: dict[str, Any] = {"max_new_tokens": 16, "min_new_tokens": 16, "do_sample": False}
    kwargs.update(pad_token_id=0, cache_implementation=None if cache == "dynamic" else cache)
    with torch.no_grad():
        expected = cpu.generate(input_ids=prompt, attention_mask=mask, **kwargs)
        actual = acc.generate(input_ids=prompt.to(ACCEL), attention_mask=mask.to(ACCEL), **kwargs)
    assert actual.device.type == "accel"
    assert expected.shape[1] >= 16
    assert actual.cpu().tolist() == expected.tolist()


def test_from_pretrained_device_map_puts_models_on_accel_devices(
    tmp_path: Any, no_fallback: None
) -> None:
    # transformers' device_map (Accelerate's big-model loading): a whole model on one accel
    # device, and one split over both by device_map="auto" with a memory budget per accel index
    # (Accelerate's automatic budget knows CUDA, XPU, NPU, ... and leaves accel's models on the
    # CPU without one). Greedy decoding of the split model crosses devices between its layers.
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **{**_GQA_DECODER, "num_hidden_layers": 4}, intermediate_size=64
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    prompt = torch.randint(1, config.vocab_size, (2, 6))
    expected = model.generate(prompt, max_new_tokens=5, do_sample=False)
    auto = transformers.AutoModelForCausalLM
    whole = auto.from_pretrained(tmp_path, device_map="accel:1")
    assert {p.device for p in whole.parameters()} == {torch.device("accel", 1)}
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    split = auto.from_pretrained(
        tmp_path, device_map="auto", max_memory={0: size // 2, 1: 4 * size}
    )
    assert {p.device for p in split.parameters()} == {torch.device("accel", i) for i in (0, 1)}
    assert split.hf_device_map["lm_head"] == 1
    for loaded in (whole, split):
        got = loaded.generate(prompt.to(loaded.device), max_new_tokens=5, do_sample=False)
        assert got.cpu().tolist() == expected.tolist()


@pytest.mark.parametrize("variant", ["lora", "dora"])
def test_peft_lora_fine_tuning_matches_cpu(variant: str, no_fallback: None) -> None:
    """PEFT's adapters (its LoRA layers wrap the model's Linear modules; DoRA adds a weight
    norm per output) train on accel as on the CPU, and merge back into the base weights."""
    import peft

    torch.manual_seed(0)
    base, vocab = _llama()
    ids = torch.randint(1, vocab, (2, 12))
    runs = {}
    for device in ("cpu", "accel"):
        config = peft.LoraConfig(
            r=4,
            lora_alpha=8,
            target_modules=["q_proj", "v_proj", "up_proj"],
            init_lora_weights="gaussian",  # B not zero: the adapters change the outputs at once
            use_dora=variant == "dora",
        )
        torch.manual_seed(1)
        model = peft.get_peft_model(copy.deepcopy(base), config).to(device)
        trained = [p for p in model.parameters() if p.requires_grad]
        assert trained and all(p.device.type == device for p in trained)
        opt = torch.optim.AdamW(trained, lr=1e-2)
        losses = []
        for _ in range(3):
            loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        merged = model.merge_and_unload()
        assert not any("lora" in name for name, _ in merged.named_parameters())
        with torch.no_grad():
            runs[device] = (losses, merged(input_ids=ids.to(device)).logits.cpu())
    torch.testing.assert_close(runs["accel"][0], runs["cpu"][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runs["accel"][1], runs["cpu"][1], rtol=1e-4, atol=1e-4)
    assert runs["cpu"][0][-1] < runs["cpu"][0][0]  # the adapters learned


def test_gpt2_embeddings_stay_tied_on_accel(no_fallback: None) -> None:
    torch.manual_seed(0)
    model, _ = _gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    acc = copy.deepcopy(model).to(ACCEL)
    assert acc.lm_head.weight is acc.transformer.wte.weight
    assert acc.lm_head.weight.device.type == "accel"


def test_bert_sequence_classification_trains_like_cpu(no_fallback: None) -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=0.0,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config)
    batches = []
    for _ in range(STEPS):
        ids = torch.randint(1, config.vocab_size, (2, 8))
        mask = torch.ones_like(ids)
        mask[1, 5:] = 0  # the second sequence is right-padded
        ids[1, 5:] = 0
        batches.append(
            {
                "input_ids": ids,
                "attention_mask": mask,
                "token_type_ids": torch.zeros_like(ids),
                "labels": torch.randint(0, config.num_labels, (2,)),
            }
        )
    _train_both(model, _hf_loss, batches)


def _vision_batches(num_classes: int) -> list[Batch]:
    # Four 64x64 images: the last stage's batch norms then normalize 16 values per channel. With
    # two 32x32 images they normalize 2 (a 1x1 feature map), and training is chaotic: the CPU
    # with one thread and with two already ends 20% apart in loss after three steps.
    return [
        {"pixels": torch.randn(4, 3, 64, 64), "labels": torch.randint(0, num_classes, (4,))}
        for _ in range(STEPS)
    ]


VISION: dict[str, Callable[[], nn.Module]] = {
    "resnet18": lambda: torchvision.models.resnet18(num_classes=10),
    "mobilenet_v3_small": lambda: torchvision.models.mobilenet_v3_small(
        num_classes=10, dropout=0.0
    ),
}


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(VISION))
def test_torchvision_trains_like_cpu(name: str, train: bool, no_fallback: None) -> None:
    """Trains with batch norm in training mode (batch statistics, running statistics updated) or
    in evaluation mode (running statistics), then compares a forward pass in evaluation mode."""
    torch.manual_seed(0)
    model = VISION[name]()
    acc = _train_both(model, _vision_loss, _vision_batches(10), train=train)
    pixels = torch.randn(4, 3, 64, 64)
    model.eval()
    acc.eval()
    with torch.no_grad():
        _assert_close(acc(pixels.to(ACCEL)), model(pixels), "logits in evaluation mode")


def test_torchvision_ops_run_on_accel_memory(no_fallback: None) -> None:
    """torchvision's own operators (torchvision::nms, roi_align and its backward) have CPU
    kernels and no accel registration: they run on accel memory, with no copying fallback."""
    g = torch.Generator().manual_seed(0)
    boxes = torch.rand(20, 4, generator=g) * 10
    boxes[:, 2:] += boxes[:, :2]
    scores = torch.rand(20, generator=g)
    kept = torchvision.ops.nms(boxes.to(ACCEL), scores.to(ACCEL), 0.5)
    assert kept.device.type == "accel"
    assert torch.equal(kept.cpu(), torchvision.ops.nms(boxes, scores, 0.5))
    x = torch.randn(2, 3, 8, 8, generator=g, requires_grad=True)
    rois = torch.tensor([[0, 0.0, 0, 4, 4], [1, 1, 1, 6, 7]])
    xa = x.detach().to(ACCEL).requires_grad_()
    out = torchvision.ops.roi_align(xa, rois.to(ACCEL), 2, sampling_ratio=2)
    expected = torchvision.ops.roi_align(x, rois, 2, sampling_ratio=2)
    _assert_close(out, expected, "roi_align")
    (out * torch.arange(out.numel(), device=ACCEL).view(out.shape)).sum().backward()
    (expected * torch.arange(expected.numel()).view(expected.shape)).sum().backward()
    _assert_close(xa.grad, x.grad, "roi_align backward")


def test_custom_operators_with_a_cpu_kernel_run_on_accel(no_fallback: None) -> None:
    """A library's own operator (torch.library) with only a CPU implementation works on accel
    tensors in place and out of place, like torchvision's."""

    @torch.library.custom_op("accel_test::scaled_add", mutates_args=("out",), device_types="cpu")
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float, out: torch.Tensor) -> None:
        assert x.device.type == "cpu"  # the CPU implementation, over accel memory
        torch.add(x, y, alpha=alpha, out=out)

    x, y = torch.randn(5), torch.randn(5)
    out = torch.zeros(5, device=ACCEL)
    scaled_add(x.to(ACCEL), y.to(ACCEL), 0.5, out)
    _assert_close(out, x + 0.5 * y, "custom operator written into an accel tensor")


def test_a_library_operator_with_cpu_and_composite_kernels_runs_its_cpu_kernel(
    no_fallback: None,
) -> None:
    """An operator with a CPU kernel and a CompositeExplicitAutograd one (torchaudio's lfilter
    loop): accel takes the composite, unless torch_accel._C._prefer_executor_kernels registers
    the CPU kernel for accel, as torch_accel does for torchaudio once it is imported."""
    import torch_accel

    lib = torch.library.Library("accel_test_pair", "DEF")
    lib.define("mark(Tensor x) -> Tensor")
    lib.impl("mark", lambda x: x + 1, "CPU")  # which kernel ran shows in the result
    lib.impl("mark", lambda x: x + 2, "CompositeExplicitAutograd")
    # A CUDA kernel and a composite: the host driver's executor (the CPU) has no kernel for it,
    # so accel keeps the composite.
    lib.define("cuda_mark(Tensor x) -> Tensor")
    lib.impl("cuda_mark", lambda x: x + 3, "CUDA")
    lib.impl("cuda_mark", lambda x: x + 4, "CompositeExplicitAutograd")
    x = torch.zeros(3)
    assert torch.ops.accel_test_pair.mark(x.to(ACCEL)).cpu().tolist() == [2.0] * 3
    registered = torch_accel._C._prefer_executor_kernels("accel_test_pair")
    assert sorted(registered) == ["accel_test_pair::cuda_mark", "accel_test_pair::mark"]
    assert torch_accel._C._prefer_executor_kernels("accel_test_pair") == []  # once
    got = torch.ops.accel_test_pair.mark(x.to(ACCEL))
    assert got.device.type == "accel" and got.cpu().tolist() == [1.0] * 3
    expected = 3.0 if torch_accel._C.driver_name() == "cuda" else 4.0
    assert torch.ops.accel_test_pair.cuda_mark(x.to(ACCEL)).cpu().tolist() == [expected] * 3
    assert torch_accel._C._prefer_executor_kernels("aten") == []  # ATen's stay ATen's
    pytest.importorskip("torchaudio")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "torchaudio::_lfilter_core_loop", "PrivateUse1"
    )


def _t5() -> tuple[nn.Module, dict[str, Any], LossFn]:
    cfg = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0,
    )  # fmt: skip
    ids = torch.randint(1, 64, (2, 7))
    return transformers.T5ForConditionalGeneration(cfg), {"input_ids": ids, "labels": ids}, _hf_loss


def _vit() -> tuple[nn.Module, dict[str, Any], LossFn]:
    cfg = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=5, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    batch = {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([1, 3])}
    return transformers.ViTForImageClassification(cfg), batch, _hf_loss


def _whisper() -> tuple[nn.Module, dict[str, Any], LossFn]:
    cfg = transformers.WhisperConfig(
        vocab_size=64, num_mel_bins=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=30, max_target_positions=20, dropout=0.0,
        decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
    )  # fmt: skip
    batch = {"input_features": torch.randn(2, 16, 60), "labels": torch.randint(3, 64, (2, 5))}
    return transformers.WhisperForConditionalGeneration(cfg), batch, _hf_loss


def _detection_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (found,) = model([batch["image"]])
    # Every parameter takes part (with weight 0) so that all of them get a gradient.
    return (
        found["boxes"].sum() + found["scores"].sum() + sum(p.sum() * 0 for p in model.parameters())
    )


def _fasterrcnn() -> tuple[nn.Module, dict[str, Any], LossFn]:
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    return model, {"image": torch.rand(3, 128, 128)}, _detection_loss


MORE: dict[str, Callable[[], tuple[nn.Module, dict[str, Any], LossFn]]] = {
    "t5": _t5,  # relative position buckets, an encoder-decoder
    "vit": _vit,  # patch embedding by convolution
    "whisper": _whisper,  # 1-d convolutions over audio features
    "fasterrcnn": _fasterrcnn,  # anchors, nms and roi_align (torchvision's own operators)
}


@pytest.mark.parametrize("name", list(MORE))
def test_more_models_forward_and_backward_like_cpu(name: str, no_fallback: None) -> None:
    torch.manual_seed(0)
    model, batch, loss_fn = MORE[name]()
    acc = copy.deepcopy(model).to(ACCEL)
    expected = loss_fn(model, batch)
    got = loss_fn(acc, _to(batch, ACCEL))
    _assert_close(got, expected, "loss")
    expected.backward()
    got.backward()
    for (n, p), q in zip(model.named_parameters(), acc.parameters(), strict=True):
        if p.grad is not None:
            _assert_close(q.grad, p.grad, f"gradient of {n}")


# One of each kind of hf_sweep's vision, audio and multimodal entries (make hf-sweep runs all):
# configurations and inputs built by test/hf_tasks.py, judged by the sweep's own verdict.
@pytest.mark.parametrize(
    "entry",
    [
        "image/deformable_detr",  # multi-scale deformable attention (grid_sample), a timm backbone
        "image/swin",  # shifted windows (roll), relative position bias
        "audio/wav2vec2",  # strided 1-d convolutions over a waveform, CTC head
        "image-text/clip",  # two towers and a contrastive logit scale
        "vision-language/llava",  # image features scattered into the text embeddings
        "vision-language/qwen2_5_vl",  # windowed vision attention over variable-length patches
    ],
)
def test_transformers_vision_audio_and_multimodal_models_train_like_cpu(entry: str) -> None:
    import hf_sweep

    verdict, detail = hf_sweep._verdict(hf_sweep._measure(entry))
    assert verdict == "ok", f"{entry}: {detail}"


# Some of timm's families with layers the other models lack (make timm-sweep runs one model of
# every family): built, run and judged by test/timm_sweep.py against a float64 CPU run. The
# slowest (3 to 9 s each with ACCEL_PROTECT_DEVICE_MEMORY) run in the default configuration only.
SLOW_IN_DEBUG = pytest.mark.default_only


@pytest.mark.parametrize(
    "name",
    [
        "test_byobnet",  # timm's own test model: a bring-your-own-blocks net
        "test_nfnet",  # normalization-free: scaled weight-standardized convolutions
        "test_mambaout",  # gated depthwise-convolution token mixers
        "test_coatnet",  # convolution stages then relative-position transformer stages
        "lambda_resnet26t",  # lambda layers (content and position lambdas)
        "botnet26t_256",  # bottleneck self-attention with relative position logits
        "gcresnext26ts",  # global context attention
        "resnest14d",  # split attention
        "skresnet18",  # selective kernels
        pytest.param("levit_128s", marks=SLOW_IN_DEBUG),  # attention biases, hard-swish
        "poolformer_s12",  # pooling as the token mixer, GroupNorm
        pytest.param("gmlp_ti16_224", marks=SLOW_IN_DEBUG),  # spatial gating units
        pytest.param("sequencer2d_s", marks=SLOW_IN_DEBUG),  # LSTMs over rows, columns
        pytest.param("volo_d1_224", marks=SLOW_IN_DEBUG),  # outlook attention (unfold)
        pytest.param("hiera_tiny_224", marks=SLOW_IN_DEBUG),  # masked-unit attention
    ],
)
def test_timm_models_train_like_the_cpu(name: str) -> None:
    import timm_sweep

    ok, detail = timm_sweep.sweep_one(name)
    assert ok, f"{name}: {detail}"
