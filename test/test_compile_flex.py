"""flex_attention under torch.compile on accel: Inductor's C++ template (the CPU's) for inference,
one fused kernel launched on the accel stream; eager flex_attention (a graph break, naming why)
where the template does not apply (gradients, return_lse). torch_accel/_inductor/flex.py and
torch_accel/_torch_fixes.py."""

from __future__ import annotations

import copy
import textwrap
import warnings

import pytest
import torch
import torch._dynamo
from torch._inductor.utils import run_and_get_code
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import helpers

warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


def _causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q >= k


def _bias(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    return s + 0.1 * (q - k) * (h + 1)


def _inputs(heads: int, kv_heads: int, seq: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(2, heads, seq, 64), (2, kv_heads, seq, 64), (2, kv_heads, seq, 64)]
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


@pytest.mark.parametrize(
    ("device", "heads", "kv_heads", "seq", "dtype"),
    [("accel:0", 4, 2, 128, torch.float32), ("accel:1", 4, 4, 100, torch.bfloat16)],
)
@helpers.cpp_kernels_only
def test_compiled_flex_attention_is_one_cpp_kernel_on_the_stream(
    device: str, heads: int, kv_heads: int, seq: int, dtype: torch.dtype
) -> None:
    torch._dynamo.reset()
    q, k, v = _inputs(heads, kv_heads, seq, dtype)
    gqa = heads != kv_heads
    expected = flex_attention(
        *(t.float() for t in (q, k, v)),
        score_mod=_bias,
        block_mask=create_block_mask(_causal, None, None, seq, seq, device="cpu"),
        enable_gqa=gqa,
    )
    mask = create_block_mask(_causal, None, None, seq, seq, device=device)
    compiled = torch.compile(flex_attention, fullgraph=True)
    with torch.no_grad():
        got, (code,) = run_and_get_code(
            compiled, *(t.to(device) for t in (q, k, v)), score_mod=_bias, block_mask=mask,
            enable_gqa=gqa,
        )  # fmt: skip
    assert got.device == torch.device(device) and got.dtype == dtype
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got.float().cpu(), expected, **tol)
    # One fused C++ kernel, an accel stream kernel (not the unfused math, not a fallback).
    assert "accel_cpp_kernel('cpp_fused_flex_attention" in code
    assert "higher_order.flex_attention" not in code


def test_compiled_flex_attention_runs_in_stream_order() -> None:
    # Fed by an eager matmul on a side stream, called in a loop without synchronizing: each
    # result equals the one computed with a synchronization in between.
    torch._dynamo.reset()
    q, k, v = (t.to("accel") for t in _inputs(4, 4, 128, torch.float32))
    w = torch.randn(64, 64, device="accel") / 8
    mask = create_block_mask(_causal, None, None, 128, 128, device="accel")
    compiled = torch.compile(flex_attention, fullgraph=True)
    with torch.no_grad():
        reference = [compiled(q @ w * i, k, v, block_mask=mask).cpu() for i in range(1, 5)]
        side = torch.accel.Stream()
        with torch.accel.stream(side):
            outs = [compiled(q @ w * i, k, v, block_mask=mask) for i in range(1, 5)]
        side.synchronize()
    for got, want in zip(outs, reference, strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@helpers.cpp_kernels_only
def test_flex_attention_with_gradients_breaks_the_graph_and_says_why() -> None:
    # The C++ template serves inference only (the Triton path has Inductor's backward template):
    # with gradients, flex_attention runs eagerly (its backward included) inside the compiled
    # function, and fullgraph=True names the reason.
    torch._dynamo.reset()
    q, k, v = (t.to("accel").requires_grad_() for t in _inputs(4, 2, 64, torch.float32))
    mask = create_block_mask(_causal, None, None, 64, 64, device="accel")
    got = torch.compile(flex_attention)(q, k, v, score_mod=_bias, block_mask=mask, enable_gqa=True)
    got.square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    eager = flex_attention(q, k, v, score_mod=_bias, block_mask=mask, enable_gqa=True)
    eager.square().sum().backward()
    torch.testing.assert_close(got, eager, rtol=0, atol=0)
    for got_grad, t in zip(grads, (q, k, v), strict=True):
        torch.testing.assert_close(got_grad, t.grad, rtol=0, atol=0)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="serves inference only; this call needs the logsumexp"):
        torch.compile(flex_attention, fullgraph=True)(q, k, v, block_mask=mask, enable_gqa=True)
    with torch.no_grad():
        out, lse = torch.compile(flex_attention)(
            q, k, v, block_mask=mask, enable_gqa=True, return_lse=True
        )
        plain, plain_lse = flex_attention(
            q, k, v, block_mask=mask, enable_gqa=True, return_lse=True
        )
    torch.testing.assert_close(out, plain, rtol=0, atol=0)
    torch.testing.assert_close(lse, plain_lse, rtol=0, atol=0)
    torch._dynamo.reset()


@helpers.skip_in_triton_interpreter(
    "Inductor's flex decoding kernel asks torch.cuda for the GPU's SM count"
)
def test_llama_with_flex_attention_infers_compiled_like_sdpa_on_the_cpu() -> None:
    # transformers' flex_attention integration compiles flex_attention itself.
    transformers = pytest.importorskip("transformers")
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    cpu = transformers.LlamaForCausalLM(config).eval()
    # _from_config sets the config's attention implementation: the CPU model, which shares the
    # config object, would run flex_attention compiled on the CPU too (on an AVX2-only CPU, with
    # these 16-dim heads and 40 tokens, Inductor's template miscomputes there: see below).
    flex = transformers.LlamaForCausalLM._from_config(
        copy.deepcopy(config), attn_implementation="flex_attention"
    )
    assert cpu.config._attn_implementation == "sdpa"
    flex.load_state_dict(cpu.state_dict())
    flex = flex.eval().to("accel")
    ids = torch.randint(0, 64, (2, 40))
    with torch.no_grad():
        expected = cpu(ids).logits
        got = flex(ids.to("accel")).logits
    torch.testing.assert_close(got.cpu(), expected, atol=2e-5, rtol=2e-5)
    torch._dynamo.reset()


@helpers.cpp_kernels_only
def test_heads_of_16_with_an_8_key_tail_run_eagerly_where_the_template_miscomputes() -> None:
    # On a CPU with AVX2 but not AVX-512 Inductor's C++ template gets a 16-dim head with a last
    # key tile of 8 wrong (torch_accel/_torch_fixes.py; test_torch_fixes.py shows it on the CPU):
    # accel runs that call eagerly. Elsewhere, and for any other key count, it compiles.
    from torch_accel import _torch_fixes

    g = torch.Generator().manual_seed(0)
    for keys in (40, 48):
        q, k, v = (torch.randn(2, 4, n, 16, generator=g).to("accel") for n in (40, keys, keys))
        torch._dynamo.reset()
        with torch.no_grad():
            eager = flex_attention(q, k, v)
            got = torch.compile(flex_attention)(q, k, v)
            torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
            defect = _torch_fixes._CPP_FLEX_VEC8 and keys % 16 == 8
            torch._dynamo.reset()
            if defect:
                with pytest.raises(Exception, match="writes a 16-column block for the 8 keys"):
                    torch.compile(flex_attention, fullgraph=True)(q, k, v)
            else:
                torch.compile(flex_attention, fullgraph=True)(q, k, v)
    torch._dynamo.reset()


def test_inductor_still_lowers_accels_flex_attention_for_a_gpu(run_python) -> None:
    # Fails once Inductor lowers flex_attention on accel itself: then drop
    # torch_accel/_inductor/flex.py (and this test). Without accel's lowering, Inductor takes its
    # Triton templates for every device but the CPU.
    code = textwrap.dedent(
        """
        import torch, torch_accel, warnings
        warnings.filterwarnings("ignore")
        import torch._inductor.compile_fx
        from torch._inductor.lowering import lowerings
        from torch.nn.attention.flex_attention import flex_attention
        hop = torch.ops.higher_order.flex_attention
        lowerings[hop] = lowerings[hop].inductor_lowering
        q = torch.randn(1, 2, 64, 64, device="accel")
        try:
            with torch.no_grad():
                torch.compile(flex_attention, fullgraph=True)(q, q.clone(), q.clone())
        except Exception as e:
            print("inductor refuses:", type(e).__name__)
        else:
            print("inductor compiles it")
        """
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "inductor refuses" in r.stdout, "Inductor lowers accel's flex_attention: drop flex.py"
