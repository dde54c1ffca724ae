"""torch.compile on accel with the structures of third-party models (values against eager and
the CPU): what sweeps of transformers, torchvision and timm models under Inductor found.

Compiled C++ kernels are cached on disk by Inductor, as for test_compile.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

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


def test_hand_written_attention_compiles_and_trains_like_the_cpu() -> None:
    # Inductor traces scaled_dot_product_attention for accel tensors while it rewrites: accel's
    # backend choice was recorded as a graph node returning an int, and AOT autograd's
    # partitioner refused the graph ("Expected _fused_sdp_choice to be a tensor"; GPT-J).
    counters.clear()
    train_classifier_like_the_cpu(_HandWrittenAttention, _sequences, 2)
    assert counters["inductor"]["fuse_attention"] > 0, "the rewrite this test is about did not run"
