"""What CUDA accepts, accel accepts too: libraries treat every device that is not the CPU like
CUDA, and ATen takes CUDA's paths for PrivateUse1 (the fused RNN cells, efficient zero
tensors). Results are compared with the CPU's."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from helpers import assert_same

ACCEL = torch.device("accel")


def _grads(module: nn.Module, inputs: list[torch.Tensor], out: object) -> list[torch.Tensor]:
    flat = [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]
    flat += [t for o in out if isinstance(o, tuple) for t in o] if isinstance(out, tuple) else []
    gen = torch.Generator().manual_seed(1)
    seeds = [torch.randn(t.shape, generator=gen).to(t.device, t.dtype) for t in flat]
    leaves = [*inputs, *module.parameters()]
    return list(torch.autograd.grad(flat, leaves, seeds))


RNNS = {
    "lstm": lambda: nn.LSTM(5, 7, num_layers=2),
    "lstm_bidirectional_batch_first": lambda: nn.LSTM(5, 7, bidirectional=True, batch_first=True),
    "lstm_no_bias_proj": lambda: nn.LSTM(5, 7, bias=False, proj_size=3),
    "gru": lambda: nn.GRU(5, 7, num_layers=2),
    "gru_bidirectional_no_bias": lambda: nn.GRU(5, 7, bidirectional=True, bias=False),
    "lstm_cell": lambda: nn.LSTMCell(5, 7),
    "gru_cell": lambda: nn.GRUCell(5, 7),
}


@pytest.mark.parametrize("name", RNNS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rnn_modules_match_cpu(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    cpu = RNNS[name]().to(dtype)
    acc = copy.deepcopy(cpu).to(ACCEL)
    cell = name.endswith("cell")
    x = torch.randn(3, 5) if cell else torch.randn(4, 3, 5)
    x = x.to(dtype).requires_grad_()
    xa = x.detach().to(ACCEL).requires_grad_()
    # The fused cells compute in float for bfloat16, as CUDA's do; the CPU's path rounds each
    # step to bfloat16.
    tol = {} if dtype == torch.float32 else {"rtol": 4e-2, "atol": 4e-2}
    out_cpu, out_acc = cpu(x), acc(xa)
    flat_cpu = out_cpu if isinstance(out_cpu, tuple) else (out_cpu,)
    flat_acc = out_acc if isinstance(out_acc, tuple) else (out_acc,)
    torch.testing.assert_close(
        torch.utils._pytree.tree_map(lambda t: t.cpu(), flat_acc), flat_cpu, **tol
    )
    for g_acc, g_cpu in zip(_grads(acc, [xa], out_acc), _grads(cpu, [x], out_cpu), strict=True):
        torch.testing.assert_close(g_acc.cpu(), g_cpu, **tol)


def test_rnn_runs_the_fused_cells_without_fallback(fallback_mode) -> None:
    fallback_mode("error")
    torch.accel.reset_fallback_stats()
    lstm = nn.LSTM(4, 6).to(ACCEL)
    out, (h, c) = lstm(torch.randn(5, 2, 4, device=ACCEL))
    out.sum().backward()
    gru = nn.GRU(4, 6).to(ACCEL).eval()
    with torch.no_grad():
        gru(torch.randn(5, 2, 4, device=ACCEL))
    assert torch.accel.fallback_stats() == {}
    assert lstm.weight_ih_l0.grad.device.type == "accel"


def test_fused_lstm_cell_checks_its_arguments() -> None:
    ig = torch.randn(2, 8, device=ACCEL)
    with pytest.raises(RuntimeError, match="hidden_gates has size"):
        torch.ops.aten._thnn_fused_lstm_cell(
            ig, torch.randn(2, 4, device=ACCEL), torch.randn(2, 2, device=ACCEL)
        )
    with pytest.raises(RuntimeError, match="expected accel tensors"):
        torch.ops.aten._thnn_fused_lstm_cell(ig, ig, torch.randn(2, 2))


def test_fused_gru_cell_matches_cpu_composition() -> None:
    torch.manual_seed(0)
    ig, hg, hx = torch.randn(3, 12), torch.randn(3, 12), torch.randn(3, 4)
    bi, bh = torch.randn(12), torch.randn(12)
    hy, ws = torch.ops.aten._thnn_fused_gru_cell(*(t.to(ACCEL) for t in (ig, hg, hx, bi, bh)))
    a, b = (ig + bi).chunk(3, 1), (hg + bh).chunk(3, 1)
    r, z = torch.sigmoid(a[0] + b[0]), torch.sigmoid(a[1] + b[1])
    n = torch.tanh(a[2] + r * b[2])
    torch.testing.assert_close(hy.cpu(), n + z * (hx - n))
    torch.testing.assert_close(ws.cpu(), torch.cat([r, z, n, hx, b[2]], 1))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int16])
def test_histc_on_integers_like_cuda(dtype: torch.dtype, fallback_mode) -> None:
    fallback_mode("error")
    x = torch.tensor([0, 1, 1, 3, 4, 4, 4, 9], dtype=dtype)
    h = torch.histc(x.to(ACCEL), bins=5, min=0, max=9)
    assert h.dtype == dtype and h.device.type == "accel"
    expected = torch.histc(x.double(), bins=5, min=0, max=9).to(dtype)
    torch.testing.assert_close(h.cpu(), expected)
    out = torch.empty(0, dtype=dtype, device=ACCEL)
    torch.histc(x.to(ACCEL), bins=5, min=0, max=9, out=out)
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_kernels_the_cpu_lacks(dtype: torch.dtype, fallback_mode) -> None:
    fallback_mode("error")
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4)
    got = nn.functional.avg_pool3d(x.to(dtype).to(ACCEL).requires_grad_(), 2)
    expected = nn.functional.avg_pool3d(x, 2)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), expected, rtol=1e-2, atol=1e-2)
    got.sum().backward()
    m = torch.randn(3, 3)
    t = torch.trace(m.to(dtype).to(ACCEL))
    assert t.dtype == dtype
    torch.testing.assert_close(
        t.float().cpu(), torch.trace(m.to(dtype).float()), rtol=1e-2, atol=1e-2
    )
    loss = nn.functional.multi_margin_loss(
        m.to(dtype).to(ACCEL), torch.tensor([0, 2, 1], device=ACCEL)
    )
    expected = nn.functional.multi_margin_loss(m.to(dtype).float(), torch.tensor([0, 2, 1]))
    torch.testing.assert_close(loss.float().cpu(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dims", [2, 3])
def test_half_precision_grid_sampling_computes_in_float32_like_cuda(
    dtype: torch.dtype, dims: int, fallback_mode
) -> None:
    # The CPU's grid samplers compute in half precision, and its 2-d kernel returns inf and NaN
    # on images of about 160 pixels and more (pytorch/pytorch#127224; kornia's warps hit it on
    # every device but the CPU, which it converts to float32 itself). CUDA's compute in float32:
    # so does accel, so its results are float32's on the same half-precision arguments, rounded.
    fallback_mode("error")
    gen = torch.Generator().manual_seed(0)
    size = (1, 3, 256, 256) if dims == 2 else (1, 2, 24, 40, 40)
    theta = torch.tensor([[0.9, 0.1, 0.05], [-0.1, 0.95, 0.02]])
    if dims == 3:
        theta = torch.tensor([[0.9, 0.1, 0.05, 0.0], [-0.1, 0.95, 0.02, 0.0], [0, 0, 1, 0]])
    x = torch.rand(size, generator=gen).to(dtype)
    grid = nn.functional.affine_grid(theta[None], list(size), align_corners=False).to(dtype)
    seed = torch.randn(size, generator=gen).to(dtype)
    for mode in ["bilinear", "nearest", "bicubic"] if dims == 2 else ["bilinear", "nearest"]:
        wide = [t.float().requires_grad_() for t in (x, grid)]
        expected = nn.functional.grid_sample(*wide, mode=mode, align_corners=False)
        expected_grads = torch.autograd.grad(expected, wide, seed.float())
        narrow = [t.to(ACCEL).requires_grad_() for t in (x, grid)]
        got = nn.functional.grid_sample(*narrow, mode=mode, align_corners=False)
        grads = torch.autograd.grad(got, narrow, seed.to(ACCEL))
        assert got.dtype == dtype and all(g.dtype == dtype for g in grads)
        assert torch.equal(got.cpu(), expected.to(dtype)), mode
        for g, e in zip(grads, expected_grads, strict=True):
            assert torch.equal(g.cpu(), e.to(dtype)), mode


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_3d_adaptive_average_pooling_sums_in_float32_like_cuda(
    dtype: torch.dtype, fallback_mode
) -> None:
    # The CPU's kernel sums each window in half precision: for 24x24x24 windows its sums stop
    # growing (a relative error of 0.7 in float16, 0.96 in bfloat16). CUDA's sums in float32.
    fallback_mode("error")
    x = torch.rand(1, 2, 48, 48, 48, generator=torch.Generator().manual_seed(0)).to(dtype)
    wide = x.float().requires_grad_()
    expected = nn.functional.adaptive_avg_pool3d(wide, 2)
    seed = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    (expected_grad,) = torch.autograd.grad(expected, wide, seed.float())
    narrow = x.to(ACCEL).requires_grad_()
    got = nn.functional.adaptive_avg_pool3d(narrow, 2)
    (grad,) = torch.autograd.grad(got, narrow, seed.to(ACCEL))
    assert got.dtype == grad.dtype == dtype
    assert torch.equal(got.cpu(), expected.to(dtype))
    assert torch.equal(grad.cpu(), expected_grad.to(dtype))
    out = torch.empty(0, dtype=dtype, device=ACCEL)
    torch._C._nn.adaptive_avg_pool3d(x.to(ACCEL), 2, out=out)
    assert torch.equal(out.cpu(), expected.to(dtype))


def test_float16_with_complex_numbers_computes_in_complex32_like_cuda(fallback_mode) -> None:
    # pow of a float16 tensor and a complex Python number (or a complex32 tensor) computes in
    # complex32: CUDA's kernel takes it, the CPU's refuses it (PyTorch's test_binary_ufuncs.py).
    fallback_mode("error")
    x = torch.rand(8, generator=torch.Generator().manual_seed(0)).half() + 0.5
    acc = x.to(ACCEL)
    wide = x.to(torch.complex64)
    cases = [
        (lambda t: torch.pow(1j, t), lambda w: torch.pow(1j, w)),
        (lambda t: t ** (2.2 - 1.6j), lambda w: w ** (2.2 - 1.6j)),
        (
            lambda t: torch.tensor(1.5j, dtype=torch.complex32, device=t.device) ** t,
            lambda w: torch.tensor(1.5j) ** w,
        ),
    ]
    for f, ref in cases:
        got = f(acc)
        assert got.dtype == torch.complex32
        torch.testing.assert_close(
            got.cpu().to(torch.complex64), ref(wide).to(torch.complex32).to(torch.complex64)
        )
    out = torch.empty(8, dtype=torch.complex32, device=ACCEL)
    assert torch.pow(1j, acc, out=out) is out
    torch.testing.assert_close(
        out.cpu().to(torch.complex64), torch.pow(1j, wide), atol=2e-3, rtol=2e-3
    )
    with pytest.raises(RuntimeError, match="ComplexHalf can't be cast to the desired output type"):
        acc.clone().pow_(1j)  # a float16 tensor cannot hold the result, as on CUDA and the CPU
    assert torch.pow(2.0, acc).dtype == torch.float16  # real numbers: float16, as before
    # _foreach_pow too, each tensor's result of its own dtype
    got = torch._foreach_pow([acc, acc], [2.0, 1j])
    assert [g.dtype for g in got] == [torch.float16, torch.complex32]
    torch.testing.assert_close(got[0].cpu(), x**2.0)
    torch.testing.assert_close(
        got[1].cpu().to(torch.complex64), torch.pow(wide, 1j), atol=2e-3, rtol=2e-3
    )
    got = torch._foreach_pow(1j, [acc])
    torch.testing.assert_close(
        got[0].cpu().to(torch.complex64), torch.pow(1j, wide), atol=2e-3, rtol=2e-3
    )
    with pytest.raises(RuntimeError, match="ComplexHalf can't be cast to the desired output type"):
        torch._foreach_pow_([acc.clone()], 1j)


def test_abs_of_bool_like_cuda() -> None:
    x = torch.tensor([True, False, True], device=ACCEL)
    assert torch.abs(x).dtype == torch.bool
    assert torch.abs(x).cpu().tolist() == [True, False, True]
    x.abs_()
    assert x.cpu().tolist() == [True, False, True]
    # _foreach_abs too, out of place and in place (PyTorch's test_foreach.py)
    xs = [torch.tensor([True, False], device=ACCEL), torch.tensor([[False], [True]], device=ACCEL)]
    ys = torch._foreach_abs(xs)
    assert [y.dtype for y in ys] == [torch.bool, torch.bool]
    assert [y.cpu().tolist() for y in ys] == [[True, False], [[False], [True]]]
    torch._foreach_abs_(xs)
    assert [(x.dtype, x.cpu().tolist()) for x in xs] == [
        (torch.bool, [True, False]),
        (torch.bool, [[False], [True]]),
    ]


def test_ldexp_with_integer_exponents(fallback_mode) -> None:
    fallback_mode("error")
    x, e = torch.tensor([1.0, 0.5, -3.0]), torch.tensor([1, 2, 3])
    torch.testing.assert_close(torch.ldexp(x.to(ACCEL), e.to(ACCEL)).cpu(), torch.ldexp(x, e))
    y = x.to(ACCEL)
    y.ldexp_(e.to(ACCEL))
    torch.testing.assert_close(y.cpu(), torch.ldexp(x, e))


def test_mode_and_index_fill_with_cpu_index() -> None:
    v, i = torch.mode(torch.tensor([1.0, 2, 2, 3], device=ACCEL))
    assert (v.item(), v.device.type) == (2.0, "accel")
    x = torch.zeros(4, device=ACCEL).index_fill(0, torch.tensor([1, 2]), 5.0)
    assert x.cpu().tolist() == [0.0, 5.0, 5.0, 0.0]
    x.index_fill_(0, torch.tensor([0]), -1.0)
    assert x.cpu().tolist() == [-1.0, 5.0, 5.0, 0.0]


def test_storage_type_is_the_accel_legacy_class() -> None:
    with pytest.warns(UserWarning, match="TypedStorage is deprecated"):
        t = torch.ones(2, device=ACCEL).storage_type()
    assert t is torch.accel.FloatStorage
    assert torch.ones(1, dtype=torch.int64, device=ACCEL).storage_type() is torch.accel.LongStorage
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage's warning comes once only
        s = torch.accel.FloatStorage(3)
    assert s.device.type == "accel" and s.dtype == torch.float32 and s.size() == 3


def test_efficient_zero_tensors(fallback_mode) -> None:
    # sgn's backward (and others) return efficient zero tensors for zero gradients.
    fallback_mode("error")
    z = torch._efficientzerotensor((2, 3), device=ACCEL)
    assert z.device.type == "accel" and z._is_zerotensor()
    torch.testing.assert_close((z + 1).cpu(), torch.ones(2, 3))
    x = torch.randn(4, device=ACCEL, requires_grad=True)
    (g,) = torch.autograd.grad(torch.sgn(x), x, torch.ones(4, device=ACCEL))
    torch.testing.assert_close(g.cpu(), torch.zeros(4))


def test_transformer_fast_path_with_padding_mask_matches_cpu(fallback_mode) -> None:
    # In eval mode PyTorch takes its fused fast path for PrivateUse1 as for CUDA: the padded
    # batch becomes a nested tensor (_nested_tensor_from_mask) that the layers run on.
    fallback_mode("error")
    torch.manual_seed(0)
    x, y = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    modules = {
        "encoder": (nn.TransformerEncoder(layer, 2, enable_nested_tensor=True), (x,)),
        "transformer": (nn.Transformer(8, 2, 1, 1, 16, batch_first=True), (x, y)),
    }
    for name, (cpu, args) in modules.items():
        cpu.eval()
        acc = copy.deepcopy(cpu).to(ACCEL)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
            expected = cpu(*args, src_key_padding_mask=mask)
            got = acc(*(a.to(ACCEL) for a in args), src_key_padding_mask=mask.to(ACCEL))
        assert got.device.type == "accel", name
        torch.testing.assert_close(got.cpu(), expected, msg=name)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mha_acc = copy.deepcopy(mha).to(ACCEL)
    with torch.no_grad():
        expected, _ = mha(x, x, x, key_padding_mask=mask, need_weights=False)
        xa = x.to(ACCEL)
        got, _ = mha_acc(xa, xa, xa, key_padding_mask=mask.to(ACCEL), need_weights=False)
    torch.testing.assert_close(got.cpu(), expected)


def test_nested_tensors_run_the_cpu_kernels_on_accel_memory(fallback_mode) -> None:
    fallback_mode("error")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        n = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
        na = n.to(ACCEL)
    assert na.is_nested and na.device.type == "accel"
    got = (na * 2 + 1).to_padded_tensor(0.0)
    assert got.device.type == "accel"
    torch.testing.assert_close(got.cpu(), (n * 2 + 1).to_padded_tensor(0.0))
    parts = na.unbind()
    assert [p.device.type for p in parts] == ["accel", "accel"]
    torch.testing.assert_close(parts[1].cpu(), n.unbind()[1])
    parts[0].fill_(7.0)  # unbind returns views: writing one writes the nested tensor
    assert (na.to_padded_tensor(0.0)[0, :2].cpu() == 7.0).all()
    back = na.cpu()
    assert back.is_nested and back.device.type == "cpu"
    torch.testing.assert_close(back.unbind()[1], n.unbind()[1])
    assert torch.accel.fallback_stats() == {}


def test_nested_tensor_metadata_stays_on_the_cpu_through_autograd(fallback_mode) -> None:
    # A nested tensor's sizes live in a CPU tensor on every device (CUDA's too); the backward of
    # to_padded_tensor rebuilds a nested gradient from them (test_nestedtensor.py's
    # test_detach failed in that backward: the sizes had been copied into accel memory).
    fallback_mode("error")
    torch.manual_seed(0)
    a, b = torch.randn(2, 4), torch.randn(5, 4)
    weights = torch.randn(2, 5, 4)
    grads = []
    for device in ("cpu", ACCEL):
        x, y = (t.detach().to(device).requires_grad_() for t in (a, b))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
            n = torch.nested.as_nested_tensor([x, y])
        sizes = n._nested_tensor_size()
        assert sizes.device.type == "cpu" and sizes.tolist() == [[2, 4], [5, 4]]
        assert n._nested_tensor_strides().device.type == "cpu"
        assert n._nested_tensor_storage_offsets().device.type == "cpu"
        padded = torch.nested.to_padded_tensor(n * 3, 0.0)
        (padded * weights.to(device)).sum().backward()
        grads.append((x.grad, y.grad))
    for got, expected in zip(grads[1], grads[0], strict=True):
        assert got.device.type == "accel"
        torch.testing.assert_close(got.cpu(), expected)
    assert torch.accel.fallback_stats() == {}


def _nested_pair(device: str, requires_grad: bool = False, heads: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    lead = (heads,) if heads else ()
    parts = [torch.randn(*lead, 3, 8, generator=g), torch.randn(*lead, 5, 8, generator=g)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        return torch.nested.nested_tensor(parts, device=device, requires_grad=requires_grad)


NESTED_KERNELS = {
    # composites elsewhere, nested kernels of their own for NestedTensorCPU and CUDA
    "linear": lambda nt, w: torch.nn.functional.linear(nt, w),
    "matmul": lambda nt, w: torch.matmul(nt, nt.transpose(-1, -2)),
    "chunk": lambda nt, w: nt.chunk(2, -1)[1].contiguous(),
    "narrow": lambda nt, w: nt.narrow(0, 1, 1).contiguous(),
    "softmax": lambda nt, w: nt.softmax(-1),
    "sdpa": lambda nt, w: torch.nn.functional.scaled_dot_product_attention(nt, nt, nt),
}


@pytest.mark.parametrize("name", list(NESTED_KERNELS))
def test_nested_tensors_take_their_nested_kernels(name: str, fallback_mode) -> None:
    # On accel these used to decompose into dense operators, which nested tensors refuse
    # ("NestedTensorImpl doesn't support sizes"): found by test_nestedtensor.py.
    fallback_mode("error")
    w = torch.randn(4, 8)
    backward = name not in ("chunk", "narrow")  # strided nested tensors have no backward
    results = []
    for device in ("cpu", ACCEL):
        nt = _nested_pair(device, requires_grad=backward, heads=2 if name == "sdpa" else 0)
        out = NESTED_KERNELS[name](nt, w.to(device))
        padded = torch.nested.to_padded_tensor(out, 0.0)
        results.append([padded.detach()])
        if backward:
            padded.sum().backward()
            results[-1].append(torch.nested.to_padded_tensor(nt.grad, 0.0))
    for got, expected in zip(results[1], results[0], strict=True):
        assert got.device.type == "accel"
        torch.testing.assert_close(got.cpu(), expected)
    assert torch.accel.fallback_stats() == {}


def test_nested_views_in_inference_mode_are_normal_tensors(fallback_mode) -> None:
    # Views of a normal tensor made in inference mode stay normal tensors (autograd gives them
    # the base's version counter), on accel as on the CPU.
    fallback_mode("error")
    for device in ("cpu", ACCEL):
        nt = _nested_pair(device, heads=2)
        with torch.inference_mode():
            views = [nt.transpose(-1, -2), nt.unbind()[1], nt[0], nt.view(2, 2, -1, 8)]
        for v in views:
            assert v._is_view() and not v.is_inference(), (device, v.shape)
        views[1].fill_(3.0)  # a view: writes the nested tensor
        assert (torch.nested.to_padded_tensor(nt, 0.0)[1] == 3.0).all()
        with torch.inference_mode():
            fresh = _nested_pair(device)
            assert fresh.transpose(-1, -2).is_inference()
    assert torch.accel.fallback_stats() == {}


# Dtypes PyTorch's OpInfo database lists for CUDA and not for the CPU, which accel cannot take,
# and why (everything else of that list must run on accel, with CUDA's result dtype).
CUDA_DTYPES_NOT_TAKEN = {
    "fft.": "PyTorch's composite FFT operators refuse float16 and complex32 for any device but "
    "CUDA before an accel kernel is reached (promote_type_fft in SpectralOps.cpp)",
    "torch.ops.aten._flash_attention_forward": "a CUDA kernel's internal entry point",
    "torch.ops.aten._efficient_attention_forward": "a CUDA kernel's internal entry point",
    "__rmod__": "the samples divide by zero, which CUDA leaves undefined and the CPU refuses",
}
WIDER = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.complex32: torch.complex64,
    torch.bool: torch.uint8,
}


def _cuda_only_dtypes() -> list[tuple[str, torch.dtype]]:
    from torch.testing._internal.common_methods_invocations import op_db

    cases = []
    for op in op_db:
        if any(op.full_name.startswith(p) for p in CUDA_DTYPES_NOT_TAKEN):
            continue
        extra = set(op.supported_dtypes("cuda")) - set(op.supported_dtypes("cpu"))
        cases += [(op.full_name, dt) for dt in sorted(extra, key=str)]
    return cases


def _tensors(tree: object) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _map(fn: object, tree: object) -> object:
    return torch.utils._pytree.tree_map(
        lambda t: fn(t) if isinstance(t, torch.Tensor) else t,  # type: ignore[operator]
        tree,
    )


def _nan_reduction(reduce: str):  # noqa: ANN202
    # CUDA's nansum/nanmean of complex tensors leave out elements with a NaN part; the CPU's
    # refuse complex tensors.
    def ref(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        kept = ~torch.isnan(x)
        total = torch.where(kept, x, torch.zeros((), dtype=x.dtype)).sum(*args, **kwargs)
        if reduce == "sum":
            return total
        return total / kept.sum(*args, **{k: v for k, v in kwargs.items() if k != "dtype"})

    return ref


# How the CPU reference computes what the CPU kernel refuses, where the operator itself cannot.
REFERENCE = {"nansum": _nan_reduction("sum"), "nanmean": _nan_reduction("mean")}
# Half-precision accumulation over a whole convolution rounds far from the wide reference.
TOLERANCE = {"nn.functional.conv_transpose": {"rtol": 0.1, "atol": 0.1}}


@pytest.mark.parametrize(("name", "dtype"), _cuda_only_dtypes())
def test_dtypes_cuda_takes_and_the_cpu_does_not(name: str, dtype: torch.dtype, fallback_mode):
    # The reference: the CPU computing in a wider dtype (integers in float64), its results
    # rounded to accel's result dtypes.
    from torch.testing._internal.common_methods_invocations import op_db

    fallback_mode("error")
    op = next(o for o in op_db if o.full_name == name)
    reference = REFERENCE.get(name, op)
    random = name in ("nn.functional.rrelu",)
    tol = next((t for p, t in TOLERANCE.items() if name.startswith(p)), None)
    if tol is None and dtype in WIDER:
        tol = {"rtol": 2e-2, "atol": 2e-2}
    torch.manual_seed(0)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:4]
    assert samples, name
    wider = WIDER.get(
        dtype, dtype if dtype.is_floating_point or dtype.is_complex else torch.float64
    )
    for s in samples:
        call = (s.input, s.args, s.kwargs)
        got_in = _map(lambda t: t.to(ACCEL), call)
        got = op(got_in[0], *got_in[1], **got_in[2])
        ref_in = _map(lambda t: t.to(wider) if t.dtype == dtype else t, call)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = reference(ref_in[0], *ref_in[1], **ref_in[2])
        for g, e in zip(_tensors(got), _tensors(expected), strict=True):
            assert g.device.type == "accel", name
            if random:
                assert (g.shape, g.dtype) == (e.shape, g.dtype), name
                continue
            # The reference rounded (and overflowing) as accel's result, compared in its dtype.
            torch.testing.assert_close(g.cpu(), e.to(g.dtype), equal_nan=True, **(tol or {}))


@pytest.mark.parametrize("mode", [0, 1, 2])  # sum, mean, max
@pytest.mark.parametrize("last", [False, True])  # include_last_offset
def test_embedding_bag_returns_its_bookkeeping_like_cuda(mode: int, last: bool, fallback_mode):
    """_embedding_bag's offset2bag (the bag of each index), bag_size (one per offset) and
    max_indices (mode max only) as CUDA's kernels and the meta functions (fake tensors,
    torch.compile, graph capture) give them; the CPU's fast path leaves offset2bag empty and its
    kernel sizes the others otherwise. Found by PyTorch's test_meta.py. The gradients stay the
    CPU's."""
    w = torch.randn(10, 4)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 9])
    offsets = torch.tensor([0, 2, 2, 7] if last else [0, 2, 2])  # an empty bag in the middle
    bags = torch.tensor([0, 0, 2, 2, 2, 2, 2])
    for op in (torch.ops.aten._embedding_bag, torch.ops.aten._embedding_bag_forward_only):
        args = (idx.to(ACCEL), offsets.to(ACCEL), False, mode, False, None, last)
        wa = w.to(ACCEL)
        with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True):
            fake = op(wa, *args)
        cpu = op(w, idx, offsets, False, mode, False, None, last)
        for _ in range(2):  # the first call of a signature runs on the caller, later ones as tasks
            got = op(wa, *args)
            for g, f in zip(got, fake, strict=True):
                assert (g.shape, g.dtype) == (f.shape, f.dtype)
            assert_same(got[0], cpu[0])
            if mode != 2:
                assert_same(got[1], bags)
                assert_same(got[2], torch.tensor([2, 0, 5, 0][: len(offsets)]))
            else:
                assert_same(got[3], cpu[3])
    wc, wa = w.clone().requires_grad_(), w.to(ACCEL).requires_grad_()
    for weight, dev in ((wc, "cpu"), (wa, ACCEL)):
        out = torch.nn.functional.embedding_bag(
            idx.to(dev), weight, offsets.to(dev), mode=("sum", "mean", "max")[mode],
            include_last_offset=last,
        )  # fmt: skip
        out.pow(2).sum().backward()
    assert_same(wa.grad, wc.grad)


def test_embedding_bag_captures_as_a_first_call(fallback_mode) -> None:
    """A graph capture allocates the meta functions' results, the CPU kernel returns others:
    the first call of a signature, captured, still writes the right output."""
    w = torch.randn(6, 3, dtype=torch.float64)
    idx, offsets = torch.tensor([0, 5, 2, 2]), torch.tensor([0, 1])
    static_w, idx_accel, offsets_accel = w.to(ACCEL), idx.to(ACCEL), offsets.to(ACCEL)
    graph = torch.accel.AccelGraph()
    stream = torch.accel.Stream()
    stream.wait_stream(torch.accel.current_stream())
    with torch.accel.stream(stream), torch.accel.graph(graph):
        # float64 in sum mode: a signature no call ran before (in this process)
        out = torch.ops.aten._embedding_bag_forward_only(
            static_w, idx_accel, offsets_accel, False, 0, False, None, False, -1
        )
    torch.accel.current_stream().wait_stream(stream)
    for scale in (1.0, 3.0):
        static_w.copy_(w * scale)
        graph.replay()
        expected = torch.ops.aten._embedding_bag_forward_only(w * scale, idx, offsets)
        assert_same(out[0], expected[0])
        assert_same(out[1], torch.tensor([0, 1, 1, 1]))
