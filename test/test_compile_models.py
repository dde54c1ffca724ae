"""torch.compile on accel with the structures of third-party models (values against eager and
the CPU): what sweeps of transformers, torchvision and timm models under Inductor found.

Compiled C++ kernels are cached on disk by Inductor, as for test_compile.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config

import torch_accel  # noqa: F401
from helpers import train_classifier_like_the_cpu

ACCEL = torch.device("accel")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


class _ConvNeXtBlock(nn.Module):
    """timm's ConvNeXt block: depthwise conv, LayerNorm over channels in NHWC (a permute, so
    the next convolution gets channels-last strides), pointwise MLP, residual."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, stride=4)
        self.norm0 = nn.LayerNorm(dim)
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1 = nn.Linear(dim, 4 * dim)
        self.pw2 = nn.Linear(4 * dim, dim)
        self.proj = nn.Conv2d(dim, dim, 1)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.norm0(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # channels-last strides
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(nn.functional.gelu(self.pw1(self.norm(y)))).permute(0, 3, 1, 2)
        x = self.proj(x + y)
        return self.head(x.mean((2, 3)))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)


def test_a_convnext_block_compiles_and_trains_like_the_cpu() -> None:
    # Convolutions fed channels-last views: the compiled code checks each convolution's result
    # against the layout PyTorch's fake kernels give accel (it failed before accel's results
    # were made to agree).
    model, compiled, reference = train_classifier_like_the_cpu(_ConvNeXtBlock, _batch, 2)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.to(ACCEL)).cpu(), reference(x), atol=1e-5, rtol=1e-5)


class _HandWrittenAttention(nn.Module):
    """Attention written out as GPT-J and older transformers models write it (matmul, scale,
    softmax, matmul), which Inductor's fuse_attention pass rewrites into
    scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        scores = torch.matmul(q, k.transpose(-2, -1)).div(math.sqrt(d // self.heads))
        out = scores.softmax(dim=-1).matmul(v)
        return self.head(out.transpose(1, 2).reshape(b, s, d).mean(1))


def _sequences(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 16, 32, generator=g), torch.randint(0, 10, (2,), generator=g)


# Counts of what Inductor did while compiling stay 0 when its caches serve the graph: these tests
# compile past the graph caches (FX graph, AOT autograd), so that every pass and the scheduling
# run, while the kernels compiled from the same source come from Inductor's code cache (all
# caches off, the Mamba test took 107 s instead of 20).
@inductor_config.patch(fx_graph_cache=False)
@torch._functorch.config.patch(enable_autograd_cache=False)
def test_hand_written_attention_compiles_and_trains_like_the_cpu() -> None:
    # Inductor traces scaled_dot_product_attention for accel tensors while it rewrites: accel's
    # backend choice was recorded as a graph node returning an int, and AOT autograd's
    # partitioner refused the graph ("Expected _fused_sdp_choice to be a tensor"; GPT-J).
    counters.clear()
    train_classifier_like_the_cpu(_HandWrittenAttention, _sequences, 2)
    assert counters["inductor"]["fuse_attention"] > 0, "the rewrite this test is about did not run"


def _position_to_content(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """DeBERTa's disentangled attention term: scores gathered along the last dim, transposed."""
    scores = torch.bmm(k, q.transpose(-1, -2)) * 0.2
    return torch.gather(scores, -1, idx.expand(q.shape[0], -1, -1)).transpose(-1, -2)


def _scatter_add_transposed(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    src = torch.bmm(k, q.transpose(-1, -2)).transpose(-1, -2)
    return torch.zeros_like(src).scatter_add(-1, idx.expand(q.shape[0], -1, -1), src)


def _scatter_reduce_sum_excluding_self(q: torch.Tensor, k: torch.Tensor, idx: torch.Tensor):
    src = torch.bmm(k, q.transpose(-1, -2))
    base = torch.ones_like(src)
    return base.scatter_reduce(-1, idx.expand(q.shape[0], -1, -1), src, "sum", include_self=False)


@pytest.mark.parametrize(
    "fn", [_position_to_content, _scatter_add_transposed, _scatter_reduce_sum_excluding_self]
)
def test_sum_scatters_compile_like_the_cpu(fn) -> None:
    # Gather's backward is a sum scatter. Inductor's 2D-tiled C++ kernels wrote its atomic adds
    # out of bounds (pytorch/pytorch#191837), which the CPU avoids by running ATen's kernel:
    # DeBERTa's gradients were wrong on accel until accel followed the CPU's rule.
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, 16, 8, generator=g), torch.randn(8, 16, 8, generator=g)
    idx = torch.randint(0, 16, (1, 16, 16), generator=g)
    weight = torch.randn(8, 16, 16, generator=g)

    def grads(f, device: str) -> list[torch.Tensor]:
        a, b = (t.to(device).requires_grad_() for t in (q, k))
        (f(a, b, idx.to(device)) * weight.to(device)).sum().backward()
        return [a.grad.cpu(), b.grad.cpu()]

    for got, want in zip(grads(torch.compile(fn), "accel"), grads(fn, "cpu"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@inductor_config.patch(fx_graph_cache=False)  # past the graph caches, as above
@torch._functorch.config.patch(enable_autograd_cache=False)
def test_mamba_mixer_trains_like_the_cpu_with_loops_reordered() -> None:
    # Inductor reorders a node's loops to match a fusion partner, except on devices of type
    # "cpu": the C++ backend then ran the loops of the old order around the reordered body (out
    # of bounds: Mamba's backward crashed, or its gradients were wrong), until accel's scheduling
    # made the loop ranges follow the body.
    import transformers
    from torch._inductor import metrics
    from transformers.models.mamba.modeling_mamba import MambaMixer

    config = transformers.MambaConfig(
        hidden_size=32, state_size=8, expand=2, conv_kernel=4, time_step_rank=4
    )
    torch.manual_seed(0)
    mixer = MambaMixer(config, 0)
    x = torch.randn(2, 8, 32)
    weight = torch.randn(2, 8, 32)

    def grads(module: nn.Module, device: str) -> list[torch.Tensor]:
        inp = x.to(device).requires_grad_()
        (module(inp) * weight.to(device)).sum().backward()
        return [inp.grad.cpu()] + [p.grad.cpu() for p in module.parameters()]

    metrics.reset()
    on_accel = copy.deepcopy(mixer).to(ACCEL)
    got = grads(torch.compile(on_accel), "accel")
    assert metrics.num_loop_reordering > 0, "Inductor reordered no loops: not what this tests"
    for g, want in zip(got, grads(mixer, "cpu"), strict=True):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [False, True])
def test_a_half_precision_layer_norm_trains_compiled_like_eager(
    dtype: torch.dtype, affine: bool
) -> None:
    """A model cast to bfloat16 (its LayerNorm weights too), trained compiled: accel keeps
    native_layer_norm whole and Inductor decomposes its backward, whose kernels read mean and
    rstd as the meta function types them (float). Accel returned them in the input's dtype, as
    the CPU kernel does: gradients off by 2.3 against eager (found by PyTorch's test_decomp.py,
    which compares the dtypes)."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(64, elementwise_affine=affine).to(ACCEL, dtype)
    x = torch.randn(8, 64, device=ACCEL, dtype=dtype)

    def step(fn):  # type: ignore[no-untyped-def]
        xi = x.clone().requires_grad_()
        norm.zero_grad()
        fn(xi).float().square().sum().backward()
        grads = [xi.grad, *(p.grad for p in norm.parameters())]
        return [g.float().cpu() for g in grads]

    eager, compiled = step(norm), step(torch.compile(norm))
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, rtol=0.05, atol=0.05)


def test_the_compile_sweep_blames_accel_only_for_what_the_cpu_gets_right() -> None:
    # make compile-sweep's verdict (test/compile_sweep.py), on measured shapes of results.
    import compile_sweep

    def result(cpu_off, accel_off, cpu_loss=1e-7, accel_loss=1e-7):  # type: ignore[no-untyped-def]
        accel = {"loss_error": accel_loss, "off": accel_off}
        return {
            "cpu": {"loss_error": cpu_loss, "off": cpu_off},
            "accel": accel,  # compiled accel against eager CPU
            "accel_eager": accel,  # ... and against eager accel
        }

    key_bias = {"layer.0.key.bias": 0.68}  # about zero in truth: off on both
    assert compile_sweep._verdict(result(key_bias, {"layer.0.key.bias": 0.34}))[0]
    ok, detail = compile_sweep._verdict(result(key_bias, {**key_bias, "A_log": 0.43}))
    assert not ok and "off on accel only: 1, worst A_log 0.43" in detail
    assert not compile_sweep._verdict(result({}, {}, accel_loss=4.8e-4))[0]
    assert compile_sweep._verdict(result({}, {}, cpu_loss=1e-3, accel_loss=2e-3))[0]
    # Eager accel differs from eager CPU in the last bits (DETR): compiled accel may meet the bar
    # against eager accel instead, and the verdict says so.
    detr = result(key_bias, {**key_bias, "query_position_embeddings.weight": 2.5e-3})
    assert not compile_sweep._verdict(detr)[0]
    detr["accel_eager"] = {"loss_error": 0.0, "off": key_bias}
    ok, detail = compile_sweep._verdict(detr)
    assert ok and detail.startswith("against eager accel")
    ok, detail = compile_sweep._verdict({"skip": "compiled on the CPU: InductorError: ..."})
    assert ok and detail.startswith("skipped: compiled on the CPU")
